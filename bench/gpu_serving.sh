#!/usr/bin/env bash
# Issue 25 on one GPU, in one device call, on a Kimi-K2.5-width MXFP4 checkpoint with $LAYERS layers:
#   1. memory: per-layer device bytes as serve loads the model, at TP 1 / 4 / 8 (rank 0 of each), projected to
#      a full-depth model (bench/layer_memory.py -> $OUT/layer_memory.json);
#   2. served: the design card's one-wave levels at $SERVED_CONC through `k2bench sweep` at the default step
#      budget ($OUT/serving_sweep.json);
#   3. alone: the same one-wave levels in the engine alone, each at every step budget in $BUDGETS
#      (bench/engine_wave_bench.py -> $OUT/wave/wave_bench.json): the TTFT p50 against ITL p99 curve, and
#      the full-batch decode step split into GPU time and host phases;
#   4. the float32 check (bench/engine_gpu_bench.py --check-only -> $OUT/float32_check.json): triton against
#      torch with the torch backend's own spread under last-bit input noise beside it (F32CHECK=0: skipped);
#   5. the table of served beside alone (bench/served_vs_alone.py -> $OUT/served_vs_alone.json) and the
#      budget curve.
# Each stage is cut at what is left of $DEADLINE seconds; the wave bench writes its JSON after every wave.
#   OUT=/tmp/out [LAYERS=3] [BUDGETS=1024,2048,4096,8192] [DEADLINE=400] bash bench/gpu_serving.sh
#   bash bench/gpu_serving.sh --dry-run    # CPU: tiny checkpoint and lengths, every stage, in a few minutes
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu}
LAYERS=${LAYERS:-3}
SERVED_BUDGET=8192  # RuntimeConfig's default max_num_batched_tokens: what the sweep's server runs
BUDGETS=${BUDGETS:-2048,1024,4096,8192}  # most telling first: a cut wave bench keeps those
WAVE_CONC=${WAVE_CONC:-4,128,32}  # 4 first (served vs alone), then the curve at 128, then 32 if time is left
SERVED_CONC=${SERVED_CONC:-4,32}
DEADLINE=${DEADLINE:-400}
WORK=/tmp/k2bench-serving
START=$(date +%s)  # the deadline counts from here, the setup included
if [ "${1:-}" = "--dry-run" ]; then
  DRY=1 OUT=${OUT%/}/dry DEVICE=cpu ISL=64 OSL=8 BUDGETS=32,128 WAVE_CONC=2,4 SERVED_CONC=2,4 SERVED_BUDGET=128
  TP_LIST=1,2 CKPT=$WORK/tiny KV=0.05 DEADLINE=${DEADLINE_DRY:-900}
  mkdir -p "$OUT"; T0=$(date +%s)
  log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
else
  DRY=0 DEVICE=cuda ISL=8192 OSL=1024 TP_LIST=1,4,8 CKPT=/tmp/k2-width-$LAYERS KV=16
  [ -n "${T0:-}" ] || . bench/gpu_setup.sh
fi
mkdir -p "$WORK" "$OUT/wave"
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
cap() { local l; l=$(left); echo $(( $1 < l ? $1 : l )); }  # a stage's limit: its own, or what is left

if [ "$DRY" = 1 ]; then
  [ -f "$CKPT/config.json" ] || k2bench engine tiny --out "$CKPT" >>"$OUT/run.log" 2>&1
  BW=1000
else
  BW=$(python3 -c "import sys; sys.path.insert(0, 'bench'); from engine_gpu_bench import copy_bandwidth_gbs as bw; print(bw())")
  log "copy bandwidth $BW GB/s"
  log "checkpoint: kimi-k2-width, $LAYERS layers"
  [ -f "$CKPT/config.json" ] || k2bench engine tiny --preset kimi-k2-width --layers "$LAYERS" --device cuda --out "$CKPT" >>"$OUT/run.log" 2>&1
fi

log "memory per layer at tp $TP_LIST (limit $(cap 70)s)"
timeout "$(cap 70)" python3 bench/layer_memory.py --model "$CKPT" --device "$DEVICE" --tp "$TP_LIST" --out "$OUT" 2>&1 \
  | tee -a "$OUT/run.log" | grep -v "^ *$" | head -40

if [ "$DRY" = 0 ] && [ "${F32CHECK:-1}" = 1 ]; then
  log "float32 check with torch's own spread (limit $(cap 80)s)"
  timeout "$(cap 80)" python3 bench/engine_gpu_bench.py --model "$CKPT" --variants torch,triton --check-only --out "$OUT" 2>&1 \
    | tee -a "$OUT/run.log" | grep -E "float32 check|Error" | head -12
fi

log "served: one-wave levels $SERVED_CONC at budget $SERVED_BUDGET (limit $(cap 110)s)"
timeout --signal=TERM --kill-after=15 "$(cap 110)" k2bench sweep --engine bundled --model "$CKPT" --tp 1 \
  --server-args "--device $DEVICE --max-num-seqs 128 --max-model-len $((ISL + OSL + 64)) --kv-cache-memory $KV --max-num-batched-tokens $SERVED_BUDGET" \
  --isl "$ISL" --osl "$OSL" --conc "$SERVED_CONC" --num-prompts 1x --warmup 0 --ready-timeout 300 \
  --db "sqlite:///$WORK/k2bench.db" --json "$OUT/serving_sweep.json" --hardware "1x $DEVICE" \
  --tag purpose=served-vs-alone --eval none >"$WORK/sweep.log" 2>&1
grep -E "^\S*[│|] +[0-9]" "$WORK/sweep.log" | tee -a "$OUT/run.log"
if [ ! -f "$OUT/serving_sweep.json" ]; then  # cut before its JSON: export what the store kept
  tail -15 "$WORK/sweep.log" | tee -a "$OUT/run.log"
  k2bench export 1 --db "sqlite:///$WORK/k2bench.db" --json "$OUT/serving_sweep.json" 2>&1 | tee -a "$OUT/run.log"
fi

log "alone: one-wave levels $WAVE_CONC at budgets $BUDGETS (limit $(( $(left) - 10 ))s)"
timeout --signal=TERM --kill-after=10 "$(( $(left) - 10 ))" python3 bench/engine_wave_bench.py --model "$CKPT" \
  --device "$DEVICE" --conc "$WAVE_CONC" --budgets "$BUDGETS" --isl "$ISL" --osl "$OSL" --kv-cache-memory "$KV" \
  --loop engine --out "$OUT/wave" 2>&1 | tee -a "$OUT/run.log" | grep -E "^conc|^  mixed|Error|error" | head -40

if [ -f "$OUT/wave/wave_bench.json" ]; then
  [ -f "$OUT/serving_sweep.json" ] && python3 bench/served_vs_alone.py --sweep "$OUT/serving_sweep.json" \
    --wave "$OUT/wave/wave_bench.json" --budget "$SERVED_BUDGET" --out "$OUT" | tee -a "$OUT/run.log"
  python3 - "$OUT/wave/wave_bench.json" <<'EOF' | tee -a "$OUT/run.log"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print(f"\nbudget curve (engine alone, one wave): {'conc':>4} {'budget':>6} {'TTFT p50':>9} {'TTFT max':>9} {'TPOT p50':>9} {'ITL p99':>8} {'mixed':>6} {'wave s':>7}")
for r in sorted(rows, key=lambda r: (r["conc"], r["budget"])):
    print(f"{'':39} {r['conc']:>4} {r['budget']:>6} {r['ttft_ms_p50']:>9.0f} {r['ttft_ms_max']:>9.0f} {r['tpot_ms_p50']:>9.2f} "
          f"{r['itl_ms_p99']:>8.1f} {r['mixed_steps']:>6} {r['duration_s']:>7.1f}")
EOF
fi
rm -f "$OUT"/wave/wave_steps_*.json  # per-step detail: too many files to bring back; the summary keeps the rows
log "serving: done"
