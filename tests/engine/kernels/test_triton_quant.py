"""The one-pass Triton fake-quantisation against the torch reference `fake_quantize_mxfp4`: bit for bit,
on random rows and on the blocks where the rules have edges (zeros, ties, saturation, subnormal and huge
scales, non-finite values). Under TRITON_INTERPRET=1 on CPU; the gpu test runs the compiled kernel."""

from __future__ import annotations

import pytest
from kernel_cases import cuda_cases, interpreted_cases  # this folder

pytestmark = pytest.mark.engine

CASES = r'''
import torch
from k2bench.engine.model.mxfp4 import fake_quantize_mxfp4

def cases(device):
    g = torch.Generator().manual_seed(5)
    out = {"random": torch.randn(37, 256, generator=g) * torch.logspace(-3, 3, 37).unsqueeze(1)}
    edge = torch.randn(12, 32, generator=g)
    edge[0] = 0.0                                               # all-zero block: scale code 0
    edge[1] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4)  # ties at every midpoint
    edge[2] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -7.0] * 4)  # saturating block
    edge[3] *= 1e-39                                            # subnormal amax
    edge[4] *= 1e-30
    edge[5] *= 3e38                                             # amax near the float32 max
    edge[6, 3] = float("nan")
    edge[7, 9] = float("inf")
    edge[8, 0] = float("-inf")
    edge[9] = torch.tensor([5.75, -5.75] * 16)                  # amax rounds up a power of two (even rule)
    edge[10] = -edge[10].abs()
    edge[11, :16] = 0.0
    out["edge"] = edge
    out["bf16"] = (torch.randn(5, 7, 64, generator=g) * 10).to(torch.bfloat16)
    return {k: v.to(device) for k, v in out.items()}

def compare(device, subnormal_casts=True):
    """subnormal_casts=False skips bf16 outputs below 2^-126: the interpreter's float32 -> bf16 cast flushes
    them to zero (a defect of the interpreter; the GPU's cvt keeps them, which the gpu test checks)."""
    from k2bench.engine.kernels.triton_quant import fake_quantize
    res = {}
    for name, x in cases(device).items():
        ref = fake_quantize_mxfp4(x)
        got = fake_quantize(x)
        same = bool(torch.equal(torch.nan_to_num(got, nan=1234.5), torch.nan_to_num(ref, nan=1234.5)))
        nan_same = bool(torch.equal(got.isnan(), ref.isnan()))
        to_bf16 = fake_quantize(x, torch.bfloat16)
        keep = ref.isnan() | (ref.abs() >= 2.0**-126) | (ref == 0) if not subnormal_casts else torch.ones_like(ref, dtype=torch.bool)
        cast_same = bool(torch.equal(torch.nan_to_num(to_bf16, nan=1.5)[keep], torch.nan_to_num(ref.to(torch.bfloat16), nan=1.5)[keep]))
        res[name] = [same, nan_same, cast_same, str(got.dtype) == str(x.dtype)]
    return res
'''


def test_fake_quantize_kernel_under_interpreter():
    res = interpreted_cases(CASES, "compare('cpu', subnormal_casts=False)")
    assert res == {name: [True, True, True, True] for name in ("random", "edge", "bf16")}


@pytest.mark.gpu
def test_fake_quantize_kernel_on_cuda():
    res = cuda_cases(CASES, "compare")
    assert res == {name: [True, True, True, True] for name in ("random", "edge", "bf16")}
