#!/usr/bin/env bash
# The bundled engine at tensor parallel $TP (default 4) on that many GPUs, in one device call (issue 6):
#   1. measure device-to-device copy bandwidth (the roofline's ceiling)
#   2. write a Kimi-K2.5-width MXFP4 checkpoint (hidden 7168, 64 heads, 384 experts of 2048, top 8,
#      vocab 163840) with only $LAYERS layers, on the GPU
#   3. (TESTS=1) the gpu-marked engine tests
#   4. greedy tokens of `k2bench serve --tp $TP` against `--tp 1` on that checkpoint (float32, W4)
#   5. `k2bench sweep --isl 8192 --osl 1024` at TP $TP until $DEADLINE seconds, then the roofline table
# Everything it keeps goes to $OUT. Run from the repository root:
#   OUT=/tmp/out bash bench/gpu_tp4.sh
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu}
WORK=/tmp/k2bench-gpu-work  # logs; packed into $OUT/logs.tar.gz at the end ($OUT brings back 8 files at most)
mkdir -p "$OUT" "$WORK"
LAYERS=${LAYERS:-3}
TP=${TP:-4}
CONC=${CONC:-4,32,128}
PROMPTS=${PROMPTS:-1x}
DEADLINE=${DEADLINE:-560}
BACKEND=${BACKEND:-auto}
CKPT=${CKPT:-/tmp/k2-width}
. bench/gpu_setup.sh

log "bandwidth"
python3 -c "import json, sys; sys.path.insert(0, 'bench'); from engine_gpu_bench import copy_bandwidth_gbs as bw
print(json.dumps({'GBps': bw()}))" | tee "$OUT/bandwidth.json"
BW=$(python3 -c "import json;print(json.load(open('$OUT/bandwidth.json'))['GBps'])")

log "checkpoint: kimi-k2-width, $LAYERS layers"
k2bench engine tiny --preset kimi-k2-width --layers "$LAYERS" --device cuda --out "$CKPT" 2>&1 | tee -a "$OUT/run.log"
du -sh "$CKPT" | tee -a "$OUT/run.log"

if [ "${TESTS:-0}" = 1 ]; then
  log "gpu tests"
  timeout 150 python3 -m pytest -q -m gpu $GPU_TESTS -p no:cacheprovider >"$OUT/pytest_gpu.log" 2>&1
  tail -3 "$OUT/pytest_gpu.log" | tee -a "$OUT/run.log"
fi

# Greedy tokens of tp 1 and tp $TP with the backend the sweep uses (triton on CUDA, decode CUDA graphs on).
# In W4 the triton kernels round activations to bf16, so a different all-reduce order can flip a
# rounding and, through the random router, a token; if they differ, the torch backend (float32
# activations, eager) is checked too, which must match exactly.
GREEDY="--device cuda --dtype float32 --quant-mode w4 --max-model-len 4096 --max-num-seqs 4 --kv-cache-memory 4"
log "greedy tokens: tp 1 vs tp $TP, backend $BACKEND"
timeout 200 python3 bench/tp_greedy_check.py --model "$CKPT" --tp 1 "$TP" --server-args "$GREEDY --backend $BACKEND" \
  --lengths 7 300 3000 --max-tokens 12 --out "$WORK/tp_greedy.json" 2>&1 | tee -a "$OUT/run.log"
GREEDY_RC=${PIPESTATUS[0]}
cp "$WORK/tp_greedy.json" "$OUT/" 2>/dev/null
EAGER=""
if [ "$GREEDY_RC" != 0 ]; then
  if ! grep -q '"tokens"' "$WORK/tp_greedy.json" 2>/dev/null; then
    EAGER="--enforce-eager"  # a server failed (e.g. graph capture): run the sweep eagerly, and say so
    log "greedy check failed to run; the sweep runs with $EAGER"
  fi
  log "greedy tokens: tp 1 vs tp $TP, backend torch (reference numerics)"
  timeout 200 python3 bench/tp_greedy_check.py --model "$CKPT" --tp 1 "$TP" --server-args "$GREEDY --backend torch" \
    --lengths 7 300 3000 --max-tokens 12 --out "$WORK/tp_greedy_torch.json" 2>&1 | tee -a "$OUT/run.log"
  cp "$WORK/tp_greedy_torch.json" "$OUT/" 2>/dev/null
fi

LEFT=$(( DEADLINE - ($(date +%s) - T0) ))
log "sweep at tp $TP for at most ${LEFT}s: conc $CONC, $PROMPTS prompts per level, no warmup"
timeout --signal=TERM --kill-after=20 "$LEFT" k2bench sweep --engine bundled --model "$CKPT" --tp "$TP" \
  --server-args "--device cuda --backend $BACKEND --max-num-seqs 128 --max-model-len 9600 --kv-cache-memory 16 $EAGER" \
  --isl 8192 --osl 1024 --conc "$CONC" --num-prompts "$PROMPTS" --warmup 0 --ready-timeout 300 \
  --db "sqlite:///$WORK/k2bench.db" --json "$OUT/sweep.json" --hardware "${TP}x NVIDIA H200" \
  --tag purpose=issue6 2>&1 | tail -25 | tee -a "$OUT/run.log"
if [ ! -f "$OUT/sweep.json" ]; then  # interrupted before its JSON: export what the store kept
  k2bench export 1 --db "sqlite:///$WORK/k2bench.db" --json "$OUT/sweep.json" 2>&1 | tee -a "$OUT/run.log"
fi
cp -r results/logs "$WORK/server-logs" 2>/dev/null
if [ -f "$OUT/sweep.json" ]; then
  python3 bench/decode_roofline.py --model "$CKPT" --tp "$TP" --run "$OUT/sweep.json" --bandwidth-gbs "$BW" \
    --out "$OUT/roofline.json" | tee -a "$OUT/run.log"
fi
log "done"
tar -czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
ls -la "$OUT"
