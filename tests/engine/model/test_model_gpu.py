"""For a GPU run (the lead's device runs): the tiny model on CUDA against the CPU run, torch and triton backends.

Skipped without a CUDA device. Float32 everywhere, so CPU and CUDA differ only in summation order.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import PagedDriver, bf16_activation_reference

pytestmark = [pytest.mark.engine, pytest.mark.gpu]

PROMPTS = [[5, 9, 40, 41, 42, 100, 7, 300, 12], [77, 78], [200, 201, 202, 203, 204, 205]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    return {q: write_tiny_checkpoint(tmp_path_factory.mktemp(q), quant=q, seed=21) for q in ("bf16", "mxfp4")}


def _run(d, device, backend="torch", quant_mode="auto"):
    from k2bench.engine.model.loader import load_model

    model, cfg = load_model(d, device=device, dtype="float32", backend="torch" if backend == "ref" else backend,
                            quant_mode=quant_mode)
    if backend == "ref":  # the torch backend with bf16 activations into the MXFP4 matmuls
        object.__setattr__(model.par, "backend", bf16_activation_reference(device))
    logits = PagedDriver(model, cfg, device=device).prefill_all_logits(0, PROMPTS[0])
    tokens = PagedDriver(model, cfg, device=device, seed=3).greedy(PROMPTS, 8, chunk=4)
    return logits, tokens


@pytest.mark.parametrize("quant", ["bf16", "mxfp4"])
def test_cuda_matches_cpu_torch_backend(tiny, quant):
    cpu_logits, cpu_tokens = _run(tiny[quant], "cpu")
    gpu_logits, gpu_tokens = _run(tiny[quant], "cuda")
    assert gpu_tokens == cpu_tokens
    torch.testing.assert_close(gpu_logits, cpu_logits, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("mode", ["a4w4", "w4"])
def test_triton_backend_on_cuda(tiny, mode):
    # A4W4: FP4 x FP4 products are exact, so only summation order differs from the torch backend.
    # W4: the triton kernels take bf16 activations, so the reference rounds them the same way.
    ref_logits, ref_tokens = _run(tiny["mxfp4"], "cuda", "torch" if mode == "a4w4" else "ref", mode)
    logits, tokens = _run(tiny["mxfp4"], "cuda", "triton", mode)
    assert tokens == ref_tokens
    torch.testing.assert_close(logits, ref_logits, atol=2e-3 * float(ref_logits.abs().max()), rtol=2e-3)
