#!/usr/bin/env bash
# The server-side time split of a bundled-engine sweep on one NVIDIA GPU, in one device call: a sweep
# at Kimi-K2.5 width (random weights, LAYERS layers) with the server's /metrics scraped per level, then
# bench/server_split_table.py: client TTFT beside server TTFT = queue + prefill, the phases, and its
# checks (each phase histogram holds exactly the measured requests, inference = prefill + decode,
# client TTFT > server TTFT). Writes sweep.json, split.json and run.log under $OUT.
#   OUT=/tmp/out LAYERS=2 CONC=4,16,64 ISL=1024 OSL=256 bash bench/gpu_server_split.sh
# The device image lacks prometheus-client: carry its wheel in .whl/ (pip download prometheus-client
# --no-deps -d .whl).
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-split}
LAYERS=${LAYERS:-2}
CONC=${CONC:-4,16,64}
ISL=${ISL:-1024}
OSL=${OSL:-256}
WORK=$(mktemp -d)
. bench/gpu_setup.sh

width_checkpoint "$LAYERS"

log "sweep: conc $CONC, ISL $ISL, OSL $OSL"
CUDA_VISIBLE_DEVICES=0 timeout --signal=TERM --kill-after=20 420 k2bench sweep --engine bundled --model "$CKPT" \
  --tp 1 --isl "$ISL" --osl "$OSL" --conc "$CONC" --num-prompts 2x --warmup 1x --eval none \
  --db "sqlite:///$WORK/k2bench.db" --json "$OUT/sweep.json" 2>&1 | tail -30 | tee -a "$OUT/run.log"

[ -f "$OUT/sweep.json" ] && python3 bench/server_split_table.py "$OUT/sweep.json" --out "$OUT/split.json" | tee -a "$OUT/run.log"
log "done"
