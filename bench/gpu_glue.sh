#!/usr/bin/env bash
# Issue 11's glue and MLA decode on one GPU, in one device call: the GPU tests (kernel count per decode
# layer among them), MLA decode alone against its byte floor (with a tile / split sweep when SWEEP=1), the
# host's share of a decode step (bench/engine_step_cost.py), then bench/engine_gpu_bench.py's decode steps.
#   OUT=/tmp/out LAYERS=2 BATCHES=4,32,128 [SWEEP=1] [TESTS=0 or TEST_FILES="..."] [STEPS=30] bash bench/gpu_glue.sh
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu}
LAYERS=${LAYERS:-2}
BATCHES=${BATCHES:-4,32,128}
CTX=${CTX:-8192}
. bench/gpu_setup.sh

if [ "${TESTS:-1}" = 1 ]; then
  log "gpu tests"
  timeout 200 python3 -m pytest -q -s -m gpu ${TEST_FILES:-$GPU_TESTS} -p no:cacheprovider >"$OUT/pytest_gpu.log" 2>&1
  grep -h "kernels per decode layer" "$OUT/pytest_gpu.log" | tee -a "$OUT/run.log"
  tail -15 "$OUT/pytest_gpu.log" | grep -v "^ *$" | tee -a "$OUT/run.log"
fi
log "mla decode alone: batches $BATCHES at ctx $CTX"
python3 bench/engine_mla_bench.py --batches "$BATCHES" --ctx "$CTX" $([ "${SWEEP:-0}" = 1 ] && echo --sweep) \
  --out "$OUT" 2>&1 | tee -a "$OUT/run.log" | tail -60
width_checkpoint "$LAYERS"
log "host share of a decode step"
python3 bench/engine_step_cost.py --model "$CKPT" --batches "$BATCHES" --ctx "$CTX" --steps "${STEPS:-30}" --out "$OUT" 2>&1 \
  | tee -a "$OUT/run.log" | grep -v "^ *$" | tail -20
log "bench: decode steps"
python3 bench/engine_gpu_bench.py --model "$CKPT" --batches "$BATCHES" --ctx "$CTX" --variants "${VARIANTS:-torch,triton,triton:graphs}" \
  --prefill "${PREFILL:-8192}" --profile --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/run.log" | grep -v "^ *$" | head -40
log "done"
