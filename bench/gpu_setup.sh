# Sourced by the bench/gpu_*.sh device scripts: installs k2bench into the device image (which has
# torch, triton and numpy but lacks some harness dependencies, carried as wheels in .whl/), sets the
# NCCL switches the lent multi-GPU hosts need, and defines `log`. Needs $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
mkdir -p "$OUT"
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q -e . --no-deps --no-build-isolation >/tmp/k2bench-install.log 2>&1 \
  || { log "install failed"; tail /tmp/k2bench-install.log; exit 1; }
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee -a "$OUT/run.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/run.log"
# The GPU tests of the engine, run with `pytest -m gpu $GPU_TESTS` (files named so that pytest never collects modules that need the
# dev-only extras the image lacks).
GPU_TESTS="tests/engine/model/test_model_gpu.py tests/engine/kernels/test_triton_quant.py tests/engine/kernels/test_triton_backend.py tests/engine/kernels/test_triton_moe.py tests/engine/kernels/test_triton_moe_fast.py tests/engine/kernels/test_dense_mlp.py tests/engine/kernels/test_dense_release.py tests/engine/kernels/test_triton_routing.py tests/engine/kernels/test_triton_attention.py tests/engine/kernels/test_triton_gpu_shapes.py tests/engine/kernels/test_triton_norm.py tests/engine/kernels/test_triton_moe_glue.py tests/engine/model/test_kernel_count.py tests/engine/runtime/test_cuda_graphs_gpu.py"
# The Kimi-K2.5-width MXFP4 checkpoint with $1 layers (random weights), written on the GPU once per machine
# and shared by the scripts of one call; sets CKPT. $2 names the step in the log line.
width_checkpoint() {
  CKPT=/tmp/k2-width-$1
  log "${2:+$2: }checkpoint kimi-k2-width, $1 layers"
  [ -f "$CKPT/config.json" ] || k2bench engine tiny --preset kimi-k2-width --layers "$1" --device cuda --out "$CKPT" \
    >>"$OUT/run.log" 2>&1
}
