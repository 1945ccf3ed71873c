#!/usr/bin/env bash
# MLA decode on one GPU, in one device call: bench/engine_mla_bench.py with a sweep (splits, the Gluon
# kernel's L2 prefetch; SWEEP=full adds tiles and the tl kernel's stages), then the MLA GPU tests (the
# Gluon kernel against a float64 reference for every tile setting, the tl kernel against the torch
# backend), which reuse the bench's compiled kernels.
#   OUT=/tmp/out [BATCHES=128,32,4] [SWEEP=near|full] [TESTS=0] bash bench/gpu_mla.sh
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu}
. bench/gpu_setup.sh

log "mla bench: batches ${BATCHES:-128,32,4}, sweep ${SWEEP:-near}"
timeout "${BENCH_TIMEOUT:-120}" python3 bench/engine_mla_bench.py --batches "${BATCHES:-128,32,4}" \
  --sweep "${SWEEP:-near}" --out "$OUT" 2>&1 | tee "$OUT/mla_bench.log" | grep -v "^ *$" | tail -150
if [ "${TESTS:-1}" = 1 ]; then
  log "gpu tests: MLA decode"
  timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -m gpu tests/engine/kernels/test_triton_attention.py \
    -p no:cacheprovider >"$OUT/pytest_gpu.log" 2>&1
  tail -15 "$OUT/pytest_gpu.log" | tee -a "$OUT/run.log"
fi
log "done"
