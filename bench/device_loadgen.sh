#!/usr/bin/env bash
# The load generator on the 16-core device machine (no GPU used), in one call of about 5 minutes:
#   1. one client process at ~32k tokens/s (concurrency 64, 2 ms gap, 1,024 tokens): client CPU per
#      streamed token, timing errors, the client's own figures (loadgen_bench.py default cases);
#   2. 1, 2, 4 and 8 client processes at concurrency 1,024, 1k in / 1k out, against 8 test-server
#      processes sharing one port (cores 0-7; the client on 8-15): tokens/s carried, validity of the
#      client, TPOT error against each server's own record of its streams;
#   3. five reruns of one level: spread of steady-state against whole-level throughput.
# Results as JSON under $OUT (plus run.log).
#   OUT=/tmp/lg bash bench/device_loadgen.sh
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-loadgen}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
if [ -d .whl ]; then  # optional: orjson and httptools are not in the device image; without them json and aiohttp are used
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q -e . --no-deps --no-build-isolation >/tmp/k2bench-install.log 2>&1 \
  || { log "install failed"; tail /tmp/k2bench-install.log; exit 1; }
log "cores: $(nproc); python: $(python3 -c 'import sys, aiohttp; print(sys.version.split()[0], "aiohttp", aiohttp.__version__)')"

log "1. one process, accuracy and CPU per token"
timeout 150 python3 bench/loadgen_bench.py --out "$OUT/one_process.json" 2>>"$OUT/run.log" | tee -a "$OUT/run.log"
log "2. client processes 1, 2, 4, 8 at concurrency 1024, 1k/1k"
timeout 200 python3 bench/loadgen_bench.py --mode procs --servers 8 --out "$OUT/procs.json" 2>>"$OUT/run.log" | tee -a "$OUT/run.log"
log "3. five reruns: steady state against the whole level"
timeout 100 python3 bench/loadgen_bench.py --mode reruns --out "$OUT/reruns.json" 2>>"$OUT/run.log" | tee -a "$OUT/run.log"
log "done"
