#!/usr/bin/env bash
# A capacity search of the bundled engine on one GPU (issue 22): a Kimi-K2.5-width MXFP4 checkpoint with
# $LAYERS layers written on the GPU, then
#   k2bench capacity --slo ttft_ms=2000,tpot_ms=10 --target 0.95 at ISL 8192 / OSL 1024, TP 1,
# doubling from concurrency $START, then bisecting to 10%, at most $PROBES probes of one wave each while
# bracketing and two near the boundary (--num-prompts 1x --warmup 0, to fit one device call).
# The SLO: an 8k-token prompt answered within 2 s, then at least 100 tokens/s per user (TPOT <= 10 ms),
# an interactive chat's bounds (InferenceX's reference point is 116 tok/s/user at concurrency 4); the
# design card's 3-layer sweep on the H200 had TPOT 5.6 ms at 32 and 13.8 ms at 128, TTFT 1.5 s at 32, so
# the boundary lies inside 8..128 and the search brackets it in 4 probes.
# Files: $OUT/capacity_run.json (the run; its run.extra.capacity is the result), lines in $OUT/run.log.
# Run from the repository root:
#   OUT=/tmp/out [LAYERS=3] [START=8] [PROBES=7] [DEADLINE=330] bash bench/gpu_capacity.sh
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu}
LAYERS=${LAYERS:-3}
START=${START:-8}
PROBES=${PROBES:-7}
DEADLINE=${DEADLINE:-330}
SLO=${SLO:-ttft_ms=2000,tpot_ms=10}
WORK=/tmp/k2bench-capacity
mkdir -p "$WORK"
[ -n "${T0:-}" ] || . bench/gpu_setup.sh  # already sourced when called after another gpu_*.sh script
BEGIN=$(date +%s)

width_checkpoint "$LAYERS" "capacity"

LEFT=$(( DEADLINE - ($(date +%s) - BEGIN) ))
log "capacity: search at tp 1 for at most ${LEFT}s, SLO $SLO, from concurrency $START, $PROBES probes at most"
timeout --signal=TERM --kill-after=20 "$LEFT" k2bench capacity --slo "$SLO" --target 0.95 --by concurrency \
  --start "$START" --max-probes "$PROBES" --engine bundled --model "$CKPT" --tp 1 \
  --server-args "--device cuda --max-num-seqs 256 --max-model-len 9600 --kv-cache-memory 24" \
  --isl 8192 --osl 1024 --num-prompts 1x --warmup 0 --level-timeout 120 --ready-timeout 300 \
  --db "sqlite:///$WORK/k2bench.db" --json "$OUT/capacity_run.json" --hardware "1x NVIDIA H200" \
  --tag purpose=capacity 2>&1 | grep -v "━" | tail -40 | tee -a "$OUT/run.log"
if [ ! -f "$OUT/capacity_run.json" ]; then  # interrupted before its JSON: export what the store kept
  k2bench export 1 --db "sqlite:///$WORK/k2bench.db" --json "$OUT/capacity_run.json" 2>&1 | tee -a "$OUT/run.log"
fi
if [ -f "$OUT/capacity_run.json" ]; then
  python3 -c "import json, sys; c = json.load(open(sys.argv[1]))['run']['extra'].get('capacity'); print(json.dumps({k: c[k] for k in ('capacity', 'status', 'goodput_per_gpu', 'slo', 'target')} if c else None))" \
    "$OUT/capacity_run.json" | tee -a "$OUT/run.log"
fi
log "capacity: done"
