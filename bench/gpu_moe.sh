#!/usr/bin/env bash
# The routed-expert MoE on one GPU, in one device call: the GPU tests, the MoE kernels alone
# (bench/engine_moe_gpu_bench.py: checkpoint layout against the fast layout, tile sweep, byte floor),
# then the decode steps of bench/engine_gpu_bench.py on a Kimi-K2.5-width checkpoint.
#   OUT=/tmp/out LAYERS=2 BATCHES=4,32,128 [TESTS=1] [TEST_FILES="..."] [SWEEP=1] [MOE_TOKENS=4,32,128,8192] [STEP=1] bash bench/gpu_moe.sh
# TEST_FILES narrows the GPU tests (default: all of bench/gpu_setup.sh's GPU_TESTS); STEP=0 stops after the
# kernels alone (no checkpoint, no decode steps).
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu}
LAYERS=${LAYERS:-2}
BATCHES=${BATCHES:-4,32,128}
VARIANTS=${VARIANTS:-torch,triton,triton:graphs,triton:dot_scaled:graphs}
. bench/gpu_setup.sh

if [ "${TESTS:-1}" = 1 ]; then
  log "gpu tests"
  timeout 200 python3 -m pytest -q -m gpu ${TEST_FILES:-$GPU_TESTS} -p no:cacheprovider \
    >"$OUT/pytest_gpu.log" 2>&1
  tail -15 "$OUT/pytest_gpu.log" | tee -a "$OUT/run.log"
fi
log "moe kernels alone: tokens ${MOE_TOKENS:-4,32,128,8192}"
SWEEP_ARG=$([ "${SWEEP:-1}" = 1 ] || echo --no-sweep)
python3 bench/engine_moe_gpu_bench.py --tokens "${MOE_TOKENS:-4,32,128,8192}" --profile $SWEEP_ARG --out "$OUT" 2>&1 \
  | tee -a "$OUT/run.log" | grep -v "^ *$" | head -120

[ "${STEP:-1}" = 1 ] || { log "done"; exit 0; }
width_checkpoint "$LAYERS"
log "bench: batches $BATCHES, variants $VARIANTS"
python3 bench/engine_gpu_bench.py --model "$CKPT" --batches "$BATCHES" --variants "$VARIANTS" --prefill 0 \
  --profile --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/run.log" | grep -v "^ *$" | head -80
log "done"
