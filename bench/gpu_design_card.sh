#!/usr/bin/env bash
# The design card's sweep of the bundled engine on one GPU (issue 11's end-to-end target): a
# Kimi-K2.5-width MXFP4 checkpoint with $LAYERS layers written on the GPU, then
#   k2bench sweep --isl 8192 --osl 1024 --conc 4..128 at TP 1, one wave per level (--num-prompts 1x
#   --warmup 0, to fit one device call), and each level's median TPOT against the decode roofline.
# Files: $OUT/${NAME}_sweep.json, $OUT/${NAME}_roofline.json, lines in $OUT/run.log. Run from the repository root:
#   OUT=/tmp/out [LAYERS=3] [CONC=4..128] [DEADLINE=400] [NAME=card] [SERVER_EXTRA="--no-async-scheduling"] \
#     bash bench/gpu_design_card.sh
# SERVER_EXTRA goes to `k2bench serve` after the script's own flags (an A/B of one engine switch in one call).
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu}
LAYERS=${LAYERS:-3}
CONC=${CONC:-4..128}
DEADLINE=${DEADLINE:-400}
NAME=${NAME:-card}
SERVER_EXTRA=${SERVER_EXTRA:-}
WORK=/tmp/k2bench-$NAME
mkdir -p "$WORK"
[ -n "${T0:-}" ] || . bench/gpu_setup.sh  # already sourced when called after another gpu_*.sh script
START=$(date +%s)

log "design card: bandwidth"
BW=$(python3 -c "import sys; sys.path.insert(0, 'bench'); from engine_gpu_bench import copy_bandwidth_gbs as bw; print(bw())")
log "copy bandwidth $BW GB/s"
width_checkpoint "$LAYERS" "design card"

LEFT=$(( DEADLINE - ($(date +%s) - START) ))
log "design card ($NAME): sweep at tp 1 for at most ${LEFT}s, conc $CONC, one wave per level${SERVER_EXTRA:+, serve $SERVER_EXTRA}"
timeout --signal=TERM --kill-after=20 "$LEFT" k2bench sweep --engine bundled --model "$CKPT" --tp 1 \
  --server-args "--device cuda --max-num-seqs 128 --max-model-len 9600 --kv-cache-memory 16${SERVER_EXTRA:+ $SERVER_EXTRA}" \
  --isl 8192 --osl 1024 --conc "$CONC" --num-prompts 1x --warmup 0 --ready-timeout 300 \
  --db "sqlite:///$WORK/k2bench.db" --json "$OUT/${NAME}_sweep.json" --hardware "1x NVIDIA H200" \
  --tag purpose=design-card --tag "variant=$NAME" --eval none 2>&1 | tail -25 | tee -a "$OUT/run.log"
if [ ! -f "$OUT/${NAME}_sweep.json" ]; then  # interrupted before its JSON: export what the store kept
  k2bench export 1 --db "sqlite:///$WORK/k2bench.db" --json "$OUT/${NAME}_sweep.json" 2>&1 | tee -a "$OUT/run.log"
fi
if [ -f "$OUT/${NAME}_sweep.json" ]; then
  python3 bench/decode_roofline.py --model "$CKPT" --tp 1 --run "$OUT/${NAME}_sweep.json" --bandwidth-gbs "$BW" \
    --out "$OUT/${NAME}_roofline.json" | tee -a "$OUT/run.log"
  # what stopped every stream inside each level (server_process.Stalls): Triton compiles, longest GC pause
  python3 - "$OUT/${NAME}_sweep.json" <<'PY' | tee -a "$OUT/run.log"
import json, sys
for p in json.load(open(sys.argv[1]))["points"]:
    m = p.get("server_metrics") or {}
    c, g = m.get("counters") or {}, m.get("gauges") or {}
    print(f"conc {p['concurrency']:>4}: Triton compiles {c.get('k2bench_jit_compiles_total', '-')} "
          f"({c.get('k2bench_jit_compile_seconds_total', 0):.2f} s), longest GC pause "
          f"{(g.get('k2bench_gc_pause_longest_seconds') or {}).get('max', '-')} s")
PY
fi
log "design card ($NAME): done"
