#!/usr/bin/env bash
# The bundled engine's kernels on one GPU, in one device call: GPU tests, then every decode / prefill
# variant of bench/engine_gpu_bench.py (timed and checked against the torch backend) on a
# Kimi-K2.5-width MXFP4 checkpoint with $LAYERS layers (layer 0 dense, the rest MoE) written on the GPU.
#   OUT=/tmp/out LAYERS=2 BATCHES=4,32,128 [TESTS=0] [TUNE=1 TUNE_TP=2] bash bench/gpu_engine.sh
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu}
LAYERS=${LAYERS:-2}
BATCHES=${BATCHES:-4,32,128}
CTX=${CTX:-8192}
VARIANTS=${VARIANTS:-torch,triton,triton:graphs}
. bench/gpu_setup.sh

if [ "${TESTS:-1}" = 1 ]; then
log "gpu tests"
timeout 300 python3 -m pytest -q -m gpu $GPU_TESTS -p no:cacheprovider >"$OUT/pytest_gpu.log" 2>&1
tail -15 "$OUT/pytest_gpu.log" | tee -a "$OUT/run.log"
fi
if [ "${TUNE:-0}" = 1 ]; then
  log "kernel tiles at tp ${TUNE_TP:-2}"
  python3 bench/engine_kernel_tune.py --tp "${TUNE_TP:-2}" --out "$OUT" ${TUNE_ARGS:-} 2>&1 | tee -a "$OUT/run.log" | grep -v "^ *$" | head -120
fi

if [ "${PREFILL_BENCH:-1}" = 1 ]; then
  log "prefill pieces: attention per SDPA kernel, dense MXFP4 linears per M"
  python3 bench/engine_prefill_bench.py --out "$OUT" 2>&1 | tee -a "$OUT/run.log" | grep -v "^ *$" | head -60
fi

width_checkpoint "$LAYERS"

log "bench: batches $BATCHES at ctx $CTX, variants $VARIANTS"
python3 bench/engine_gpu_bench.py --model "$CKPT" --batches "$BATCHES" --ctx "$CTX" --variants "$VARIANTS" \
  --profile --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/run.log" | grep -v "^ *$" | head -80
log "done"
