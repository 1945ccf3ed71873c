#!/usr/bin/env bash
# The TP all-reduce on two GPUs (issue 11 item 5), in one device call of kind nvidia-h200-x2, most
# telling first so that a short call still brings back the answer:
#   1. the all-reduce GPU test (one-shot = NCCL bit for bit, eager and under CUDA graphs), plus the other
#      gpu-marked engine tests when TESTS=all
#   2. decode-step time at TP 2 for each all-reduce path (bench/tp_decode_bench.py: CUDA graphs,
#      $CTX cached tokens per sequence, batches $BATCHES), with the all-reduce alone and a logits check
#   3. greedy tokens over HTTP: TP 1, TP 2 with NCCL, TP 2 with one-shot (bench/tp_greedy_check.py)
#   4. with the time left: `k2bench sweep --isl 8192 --osl 1024` at TP 2 (--all-reduce $ALL_REDUCE) and its
#      roofline table, read per GPU against the TP 1 sweep of issue 11
# on a Kimi-K2.5-width MXFP4 checkpoint of $LAYERS layers. Everything kept goes to $OUT. From the
# repository root:   OUT=/tmp/out DEADLINE=280 bash bench/gpu_tp2.sh
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-gpu}
WORK=/tmp/k2bench-gpu-work  # server logs; packed into $OUT/logs.tar.gz at the end
mkdir -p "$OUT" "$WORK"
LAYERS=${LAYERS:-3}
BATCHES=${BATCHES:-4,32,128}
CTX=${CTX:-8192}
CONC=${CONC:-4,32,128}
PROMPTS=${PROMPTS:-1x}
ALL_REDUCE=${ALL_REDUCE:-auto}
DEADLINE=${DEADLINE:-560}  # seconds from the start; the sweep gets what is left
CKPT=${CKPT:-/tmp/k2-width}
. bench/gpu_setup.sh
left() { local l=$(( DEADLINE - ($(date +%s) - T0) )); echo $(( l > 5 ? l : 5 )); }  # never 0: timeout 0 waits forever

NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
log "GPUs: $NGPU"
[ "$NGPU" -ge 2 ] || { log "needs 2 GPUs"; exit 1; }

log "bandwidth"
python3 -c "import json, sys; sys.path.insert(0, 'bench'); from engine_gpu_bench import copy_bandwidth_gbs as bw
print(json.dumps({'GBps': bw()}))" | tee "$OUT/bandwidth.json"
BW=$(python3 -c "import json;print(json.load(open('$OUT/bandwidth.json'))['GBps'])")

log "gpu tests"
TESTS_RUN=tests/engine/runtime/test_all_reduce_gpu.py
[ "${TESTS:-}" = all ] && TESTS_RUN="$TESTS_RUN $GPU_TESTS"
timeout 200 python3 -m pytest -q -m gpu $TESTS_RUN -p no:cacheprovider >"$OUT/pytest_gpu.log" 2>&1
tail -3 "$OUT/pytest_gpu.log" | tee -a "$OUT/run.log"

log "checkpoint: kimi-k2-width, $LAYERS layers"
k2bench engine tiny --preset kimi-k2-width --layers "$LAYERS" --device cuda --out "$CKPT" 2>&1 | tail -2 | tee -a "$OUT/run.log"

log "decode step at tp 2: nccl vs one-shot, batches $BATCHES, $CTX cached tokens"
timeout "$(left)" python3 bench/tp_decode_bench.py --model "$CKPT" --tp 2 --batches "$BATCHES" --ctx "$CTX" \
  --modes nccl,one-shot --out "$OUT/tp_decode.json" 2>&1 | tee -a "$OUT/run.log"

# Greedy tokens with the backend the sweep uses (triton, decode CUDA graphs), in float32 W4 as gpu_tp4.sh
# does; with two ranks each summed element is one addition, so one-shot and NCCL must agree exactly.
GREEDY="--device cuda --dtype float32 --quant-mode w4 --max-model-len 4096 --max-num-seqs 4 --kv-cache-memory 4"
log "greedy tokens: tp 1, tp 2 nccl, tp 2 one-shot"
timeout "$(left)" python3 bench/tp_greedy_check.py --model "$CKPT" --server-args "$GREEDY" \
  --variant 1 "2:--all-reduce nccl" "2:--all-reduce one-shot" --lengths 7 300 3000 --max-tokens 12 \
  --out "$WORK/tp_greedy.json" 2>&1 | tee -a "$OUT/run.log"
cp "$WORK/tp_greedy.json" "$OUT/" 2>/dev/null

LEFT=$(left)
if [ "$LEFT" -gt 90 ]; then
  log "sweep at tp 2 (--all-reduce $ALL_REDUCE) for at most ${LEFT}s: conc $CONC, $PROMPTS prompts per level"
  timeout --signal=TERM --kill-after=20 "$LEFT" k2bench sweep --engine bundled --model "$CKPT" --tp 2 \
    --server-args "--device cuda --max-num-seqs 128 --max-model-len 9600 --kv-cache-memory 16 --all-reduce $ALL_REDUCE" \
    --isl 8192 --osl 1024 --conc "$CONC" --num-prompts "$PROMPTS" --warmup 0 --ready-timeout 300 \
    --db "sqlite:///$WORK/k2bench.db" --json "$OUT/sweep.json" --hardware "2x NVIDIA H200" \
    --tag purpose=issue11-allreduce 2>&1 | tail -25 | tee -a "$OUT/run.log"
  if [ ! -f "$OUT/sweep.json" ]; then  # interrupted before its JSON: export what the store kept
    k2bench export 1 --db "sqlite:///$WORK/k2bench.db" --json "$OUT/sweep.json" 2>&1 | tee -a "$OUT/run.log"
  fi
  cp -r results/logs "$WORK/server-logs" 2>/dev/null
  if [ -f "$OUT/sweep.json" ]; then
    python3 bench/decode_roofline.py --model "$CKPT" --tp 2 --run "$OUT/sweep.json" --bandwidth-gbs "$BW" \
      --out "$OUT/roofline.json" | tee -a "$OUT/run.log"
  fi
else
  log "no time left for the sweep (${LEFT}s)"
fi
log "done"
tar -czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
ls -la "$OUT"
