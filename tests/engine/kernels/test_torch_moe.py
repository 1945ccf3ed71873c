"""The torch backend's routed-expert MoE against a token-by-token reference written here.

Few tokens (T*k <= experts) take the batched per-pair path, more tokens the per-expert loop;
both must agree with the reference, which multiplies each token by each chosen expert's
dequantised weights in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from k2bench.engine.kernels.torch_backend import TorchBackend
from k2bench.engine.model.mxfp4 import dequantize_mxfp4, fake_quantize_mxfp4, quantize_mxfp4

pytestmark = pytest.mark.engine

E, H, INTER, K = 8, 64, 64, 2


def reference(x, ids, wts, w13, w2, a4w4):
    out = torch.zeros(x.shape, dtype=torch.float64)
    xs = fake_quantize_mxfp4(x) if a4w4 else x
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = xs[t].double() @ w13[e].double().T
            h = (F.silu(h[:INTER]) * h[INTER:]).to(x.dtype)
            if a4w4:
                h = fake_quantize_mxfp4(h)
            out[t] += float(wts[t, j]) * (h.double() @ w2[e].double().T)
    return out


@pytest.mark.parametrize("tokens", [1, 3, 4, 9])  # 4 x 2 = 8 pairs is the last batched case
@pytest.mark.parametrize("dtype,a4w4,quant", [(torch.float32, False, True), (torch.float32, True, True),
                                              (torch.bfloat16, False, True), (torch.float32, False, False)])
def test_fused_moe_matches_reference(tokens, dtype, a4w4, quant):
    g = torch.Generator().manual_seed(tokens)
    w13f = torch.randn(E, 2 * INTER, H, generator=g) * 0.1
    w2f = torch.randn(E, H, INTER, generator=g) * 0.1
    if quant:
        (w13, s13), (w2, s2) = quantize_mxfp4(w13f), quantize_mxfp4(w2f)
        d13, d2 = dequantize_mxfp4(w13, s13, dtype), dequantize_mxfp4(w2, s2, dtype)
    else:
        w13, w2, s13, s2 = w13f.to(dtype), w2f.to(dtype), None, None
        d13, d2 = w13, w2
    x = torch.randn(tokens, H, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(tokens)])
    if tokens > 1:
        ids[1] = ids[0]  # two tokens on the same experts
    wts = torch.rand(tokens, K, generator=g)
    got = TorchBackend().fused_moe(x, ids, wts, w13, s13, w2, s2, a4w4=a4w4)
    want = reference(x, ids, wts, d13, d2, a4w4)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 1e-5 if dtype == torch.float32 and not a4w4 else 3e-2  # a4w4: a one-ulp change can move a code
    assert torch.allclose(got.double(), want, rtol=tol, atol=tol * want.abs().max().item()), (got, want)


def test_batched_pairs_agree_with_expert_loop_in_bf16_a4w4():
    """bf16 + A4W4 (the tiny model's numerics): 4 tokens take the batched path; the same 4 tokens
    repeated 3 times (24 pairs > 8 experts) take the per-expert loop; the rows must agree."""
    g = torch.Generator().manual_seed(7)
    (w13, s13) = quantize_mxfp4(torch.randn(E, 2 * INTER, H, generator=g) * 0.1)
    (w2, s2) = quantize_mxfp4(torch.randn(E, H, INTER, generator=g) * 0.1)
    x = torch.randn(4, H, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(4)])
    wts = torch.rand(4, K, generator=g)
    be = TorchBackend()
    batched = be.fused_moe(x, ids, wts, w13, s13, w2, s2, a4w4=True)
    looped = be.fused_moe(x.repeat(3, 1), ids.repeat(3, 1), wts.repeat(3, 1), w13, s13, w2, s2, a4w4=True)
    for r in range(3):
        part = looped[4 * r : 4 * r + 4].float()
        assert torch.allclose(batched.float(), part, rtol=2e-2, atol=2e-2 * part.abs().max().item())
