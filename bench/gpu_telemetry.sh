#!/usr/bin/env bash
# Energy, clocks and cost of a bundled-engine sweep on one NVIDIA GPU, in one device call: the
# gpu-marked telemetry test (NVML read directly), then a sweep with telemetry on, then a per-level
# table of power, energy per token, clocks, $/Mtok and the server's counters from the run's JSON.
#   OUT=/tmp/out LAYERS=2 CONC=4,16,64 ISL=1024 OSL=256 bash bench/gpu_telemetry.sh
# The device image lacks prometheus-client and nvidia-ml-py: carry their wheels in .whl/
# (pip download prometheus-client nvidia-ml-py --no-deps -d .whl).
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-telemetry}
LAYERS=${LAYERS:-2}
CONC=${CONC:-4,16,64}
ISL=${ISL:-1024}
OSL=${OSL:-256}
WORK=$(mktemp -d)
. bench/gpu_setup.sh

log "telemetry gpu test"
timeout 120 python3 -m pytest -q -m gpu tests/harness/telemetry/test_telemetry_power.py -p no:cacheprovider \
  >"$OUT/pytest_telemetry_gpu.log" 2>&1
tail -5 "$OUT/pytest_telemetry_gpu.log" | tee -a "$OUT/run.log"
nvidia-smi --query-gpu=index,power.draw,power.limit,clocks.sm,clocks.mem --format=csv | tee -a "$OUT/run.log"

width_checkpoint "$LAYERS"

log "sweep: conc $CONC, ISL $ISL, OSL $OSL, telemetry on GPU 0"
CUDA_VISIBLE_DEVICES=0 timeout --signal=TERM --kill-after=20 420 k2bench sweep --engine bundled --model "$CKPT" \
  --tp 1 --isl "$ISL" --osl "$OSL" --conc "$CONC" --num-prompts 2x --warmup 1x --gpu-ids 0 \
  --db "sqlite:///$WORK/k2bench.db" --json "$OUT/sweep.json" 2>&1 | tail -30 | tee -a "$OUT/run.log"

[ -f "$OUT/sweep.json" ] && python3 - "$OUT/sweep.json" <<'EOF' | tee -a "$OUT/run.log"
import json, sys
doc = json.load(open(sys.argv[1]))
print("hardware:", doc["run"].get("hardware"), "| telemetry:", (doc["run"].get("extra") or {}).get("telemetry"))
head = f"{'conc':>5} {'tok/s/GPU':>10} {'valid':>6} {'W mean':>7} {'W max':>7} {'J/tok':>8} {'tok/J':>7} {'SM MHz':>7} {'$/Mtok':>8} {'prompt d':>9} {'gen d':>8}"
print(head)
for p in doc["points"]:
    e, c, s = p.get("energy") or {}, p.get("cost") or {}, (p.get("server_metrics") or {}).get("counters", {})
    g = (e.get("gpus") or [{}])[0]
    print(f"{p['concurrency']:>5} {p['tput_per_gpu']:>10.1f} {str(e.get('power_valid')):>6} {g.get('power_w_mean') or 0:>7.1f} "
          f"{g.get('power_w_max') or 0:>7.1f} {e.get('j_per_token') or 0:>8.4f} {e.get('tokens_per_j') or 0:>7.2f} "
          f"{(g.get('sm_clock_mhz') or {}).get('mean') or 0:>7.0f} {c.get('usd_per_mtok') or 0:>8.3f} "
          f"{s.get('k2bench_prompt_tokens_total', '-'):>9} {s.get('k2bench_generation_tokens_total', '-'):>8}")
    if e and not e.get("power_valid"):
        print("      not valid:", e.get("reason"))
EOF
log "done"
