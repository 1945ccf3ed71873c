#!/usr/bin/env bash
# Prefix caching on one GPU: the design-card width (a Kimi-K2.5-width MXFP4 checkpoint with $LAYERS layers,
# TP 1) under a 50% shared-prefix workload (ISL $ISL, the first half one shared system prompt, OSL $OSL),
# swept twice: prefix caching off, then on. Each sweep's levels run prime-then-measure and record the hit
# rate from the engine's k2bench_prefix_cache_{hits,queries}_total counters. Files under $OUT:
# prefix_off.json, prefix_on.json (k2bench.run), prefix_pair.json (bench/prefix_pair.py: the frontier pair,
# TTFT p50 on/off and hit rates per level), lines in run.log. About 5 minutes of GPU. From the repo root:
#   OUT=/tmp/out [LAYERS=3] [CONC=4,16,64] [ISL=8192] [OSL=256] bash bench/gpu_prefix.sh
# ON_ARGS / OFF_ARGS are the engine flags of each sweep (default: --enable-prefix-caching, and nothing).
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu}
LAYERS=${LAYERS:-3}
CONC=${CONC:-4,16,64}
ISL=${ISL:-8192}
OSL=${OSL:-256}
ON_ARGS=${ON_ARGS:---enable-prefix-caching}
OFF_ARGS=${OFF_ARGS:-}
DEADLINE=${DEADLINE:-150}  # seconds per sweep
WORK=/tmp/k2bench-prefix
mkdir -p "$WORK"
[ -n "${T0:-}" ] || . bench/gpu_setup.sh
cat >"$WORK/prefix-card.toml" <<TOML
name = "prefix50-card"
description = "ISL $ISL / OSL $OSL, the first half of every prompt shared (one group)"
isl = $ISL
osl = $OSL
prefix_len = $(( ISL / 2 ))
prefix_groups = 1
TOML

width_checkpoint "$LAYERS" "prefix"

for side in off on; do
  if [ "$side" = on ]; then FLAGS=$ON_ARGS; else FLAGS=$OFF_ARGS; fi
  log "prefix: sweep with caching $side ($FLAGS), conc $CONC, at most ${DEADLINE}s"
  timeout --signal=TERM --kill-after=20 "$DEADLINE" k2bench sweep --engine bundled --model "$CKPT" --tp 1 \
    --server-args "--device cuda --max-num-seqs 64 --max-model-len $(( ISL + OSL + 64 )) --kv-cache-memory 16 $FLAGS" \
    --workload "$WORK/prefix-card.toml" --conc "$CONC" --num-prompts 2x --warmup 1 --ready-timeout 300 \
    --db "sqlite:///$WORK/k2bench.db" --json "$OUT/prefix_$side.json" --hardware "1x NVIDIA H200" \
    --tag purpose=prefix-cache --tag prefix_caching=$side --eval none 2>&1 | tail -12 | tee -a "$OUT/run.log"
done
if [ -f "$OUT/prefix_off.json" ] && [ -f "$OUT/prefix_on.json" ]; then
  python3 bench/prefix_pair.py --off "$OUT/prefix_off.json" --on "$OUT/prefix_on.json" --out "$OUT/prefix_pair.json" \
    | tee -a "$OUT/run.log"
fi
log "prefix: done"
