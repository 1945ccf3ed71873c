#!/usr/bin/env bash
# `k2bench eval` end to end at Kimi-K2.5 width on one GPU: the same tiny-arith evaluation the CPU tests run
# on the trained tiny model, here against the kimi-k2-width MXFP4 checkpoint path (random weights, so its
# accuracy means nothing; what it shows is the plumbing: lm-eval -> HTTP -> scheduler -> Triton MXFP4
# kernels at real layer width, with 32 requests in flight), then a short sweep that stores an evaluation
# under its run. lm-eval and the packages the device image lacks come as wheels in .whl/ (bench/gpu_setup.sh).
#   OUT=/tmp/out LAYERS=2 LIMIT=500 CONC=32 [SWEEP=1] bash bench/gpu_eval.sh
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu-eval}
LAYERS=${LAYERS:-2}
LIMIT=${LIMIT:-500}
CONC=${CONC:-32}
CKPT=/tmp/k2-width-$LAYERS
. bench/gpu_setup.sh

python3 -c "import lm_eval, datasets; print('lm_eval', lm_eval.__version__, 'datasets', datasets.__version__)" \
  2>&1 | tee -a "$OUT/run.log"
[ "${PIPESTATUS[0]}" = 0 ] || { log "lm-eval does not import here"; exit 1; }

log "checkpoint: kimi-k2-width, $LAYERS layers"
[ -f "$CKPT/config.json" ] || k2bench engine tiny --preset kimi-k2-width --layers "$LAYERS" --device cuda \
  --out "$CKPT" >>"$OUT/run.log" 2>&1 || { log "checkpoint failed"; exit 1; }

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
log "serve on $URL"
k2bench serve --model "$CKPT" --device cuda --port "$PORT" --max-model-len 4096 --max-num-seqs 64 \
  >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 300); do
  python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "$URL/health" \
    2>/dev/null && break
  kill -0 $SERVER 2>/dev/null || { log "server exited"; tail -20 "$OUT/server.log"; exit 1; }
  sleep 1
done
log "server ready"

log "eval: tiny-arith, $LIMIT items, $CONC in flight"
k2bench eval --url "$URL" --task tiny-arith --limit "$LIMIT" \
  --concurrency "$CONC" --json "$OUT/eval.json" 2>&1 | tee -a "$OUT/run.log"

if [ "${SWEEP:-1}" = 1 ]; then
  log "sweep: isl 1024, osl 128, concurrency $CONC, with --eval tiny-arith@$CONC"
  k2bench sweep --url "$URL" --model "$CKPT" --gpus 1 --isl 1024 --osl 128 --conc "$CONC" \
    --eval "tiny-arith@$CONC" --eval-limit "$LIMIT" --db "sqlite:///$OUT/sweep.db" --json "$OUT/sweep.json" \
    --no-telemetry 2>&1 | tee -a "$OUT/run.log" | tail -30
fi
log "done"
ls -la "$OUT" | tee -a "$OUT/run.log"
