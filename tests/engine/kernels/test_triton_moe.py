"""The Triton fused MXFP4 MoE (engine/kernels/triton_moe.py) under TRITON_INTERPRET=1, against float64.

The kernels run in a child process because the interpreter must be switched on before triton
compiles anything. The reference here is written independently: dequantised weights, a loop over
each token's k experts in float64, with the kernel's documented activation rounding (bf16 for W4,
MXFP4 fake-quantisation for A4W4).

Tolerance: 1e-5 of the output scale for float32 summation order, plus half a bf16 ulp (2^-8 |ref|)
when the output is cast to bf16. W4 adds, for each element h_l that lies within 1e-6 (relative) of
a bf16 rounding midpoint, the effect of rounding it the other way: the kernel forms h in float32,
the reference in float64, so only those elements may round differently (one bf16 ulp, <= 2^-7 |h_l|,
times w_j |W2[i, l]|). In practice none are that close, so the bound stays at float32 level and a
systematic error (truncating instead of rounding, wrong nibble order, wrong scale or expert) fails.
A4W4 products are exact, so only the summation-order and output-cast terms apply.
"""

from __future__ import annotations

import warnings

import pytest
import torch

# the interpreted kernel run behind the module fixture may take minutes on a loaded 2-core machine
pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

pytest.importorskip("triton")

from kernel_cases import run_interpreted  # noqa: E402  (this folder; after the importorskip)

from k2bench.engine.kernels.triton_moe import fused_moe_mxfp4  # noqa: E402  (after the importorskip)
from k2bench.engine.kernels.triton_moe_glue import moe_align_sizes  # noqa: E402

CHILD = r"""
import json, torch
import torch.nn.functional as F
from k2bench.engine.kernels.torch_backend import TorchBackend
from k2bench.engine.kernels.triton_moe import fused_moe_mxfp4
from k2bench.engine.model.mxfp4 import dequantize_mxfp4, fake_quantize_mxfp4, quantize_mxfp4

torch.set_num_threads(1)


from moe_reference import make, reference, routing


cases = []
# (E, H, L, k, T, block overrides, skew): unused experts in every case (ids drawn from a subset)
# (T=1: a token per expert and block; T=12: 36 pairs, several per expert's block; a T=3 between them
# ran the same masked single-block path again, so it is left out)
shapes = [
    (12, 128, 64, 3, 1, {}, None),
    (12, 128, 64, 3, 12, {}, None),  # 36 pairs over 9 experts
    (8, 96, 32, 2, 20, {}, 3),  # 20 pairs on expert 3: two BLOCK_M=16 blocks
    (8, 96, 32, 2, 20, {"block_m": 32, "block_n": 32, "block_k": 32}, 3),
]
for si, (E, H, L, k, T, over, skew) in enumerate(shapes):
    g, w, d13, d2 = make(si, E, H, L)
    allowed = torch.tensor([e for e in range(E) if e not in (0, E - 2)])
    x = torch.randn(T, H, generator=g) * 2
    ids, wts = routing(g, T, k, allowed, skew)
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        for a4w4 in (False, True):
            ref, flip = reference(xd, ids, wts, d13, d2, a4w4)
            got = fused_moe_mxfp4(xd, ids, wts, *w, a4w4=a4w4, **over)
            err = (got.double() - ref).abs()
            tol = 1e-5 * ref.abs().max() + flip
            if dtype == torch.bfloat16:
                tol = tol + 2.0**-8 * ref.abs()
            cases.append({"case": [E, H, L, k, T, str(dtype), a4w4, over],
                          "dtype_ok": got.dtype == dtype and list(got.shape) == [T, H],
                          "worst": float((err / tol).max()), "err": float(err.max()), "flips": bool(flip.any()),
                          "scale": float(ref.abs().max())})

# Split-K: H=256 is 8 K tiles of 32 and L=96 is 3, so (3, 2) slices them 3+3+2 and 2+1 (uneven),
# 5 -> 4 slices of 2 along H; (None, None) is the automatic choice (2 slices of H, L whole);
# (1, 2) splits only the down GEMM. Same reference and tolerance as the unsplit cases: split
# partials change only the float32 summation order before silu and before the bf16 / MXFP4 rounding.
split_cases = []
E, H, L, k, T = 10, 256, 96, 3, 4
g, w, d13, d2 = make(50, E, H, L)
x = torch.randn(T, H, generator=g) * 2
ids, wts = routing(g, T, k, torch.arange(1, E))
for a4w4 in (False, True):
    ref, flip = reference(x, ids, wts, d13, d2, a4w4)
    for split_k, down_split_k in [(3, 2), (None, None), (5, None), (1, 2)]:
        got = fused_moe_mxfp4(x, ids, wts, *w, a4w4=a4w4, block_k=32, split_k=split_k, down_split_k=down_split_k)
        err = (got.double() - ref).abs()
        split_cases.append({"case": [a4w4, split_k, down_split_k], "shape_ok": list(got.shape) == [T, H],
                            "worst": float((err / (1e-5 * ref.abs().max() + flip)).max()),
                            "scale": float(ref.abs().max())})
xb = x.to(torch.bfloat16)  # one bf16 output: the final cast happens after the split sums
ref, flip = reference(xb, ids, wts, d13, d2, False)
got = fused_moe_mxfp4(xb, ids, wts, *w, block_k=32, split_k=3, down_split_k=2)
err = (got.double() - ref).abs()
split_cases.append({"case": ["bf16", 3, 2], "shape_ok": got.dtype == torch.bfloat16,
                    "worst": float((err / (1e-5 * ref.abs().max() + flip + 2.0**-8 * ref.abs())).max()),
                    "scale": float(ref.abs().max())})

# A4W4 against the torch backend (float32 input: both keep gate/up/h in float32 before quantising)
agree = []
for T in (1, 12):  # 3 pairs <= 12 experts: its batched per-pair path; 36 pairs: its per-expert loop
    g, w, d13, d2 = make(100 + T, 12, 128, 64)
    x = torch.randn(T, 128, generator=g)
    ids, wts = routing(g, T, 3, torch.arange(1, 11))
    want = TorchBackend().fused_moe(x, ids, wts, *w, a4w4=True)
    got = fused_moe_mxfp4(x, ids, wts, *w, a4w4=True)
    agree.append({"T": T, "rel": float((got - want).abs().max() / want.abs().max())})
print("RESULT" + json.dumps({"cases": cases, "agree": agree, "split": split_cases}))
"""


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(CHILD)


def test_matches_float64_reference(interpreted):
    cases = interpreted["cases"]
    assert len(cases) == 4 * 2 * 2
    for c in cases:
        assert c["dtype_ok"], c
        assert c["worst"] <= 1.0, c
        assert c["scale"] > 0.1, c  # the outputs are not trivially zero


def test_a4w4_agrees_with_torch_backend(interpreted):
    assert len(interpreted["agree"]) == 2
    for c in interpreted["agree"]:
        assert c["rel"] < 1e-5, c


def test_split_k_matches_float64_reference(interpreted):
    cases = interpreted["split"]
    assert len(cases) == 2 * 4 + 1
    for c in cases:
        assert c["shape_ok"], c
        assert c["worst"] <= 1.0, c
        assert c["scale"] > 0.1, c


def test_moe_auto_split():
    """Decode at Kimi width (TP 2) splits the long gate/up K; prefill-sized launches and the short
    down K of the test shape stay whole."""
    from k2bench.engine.kernels.moe_dispatch import scaled_tiles
    from k2bench.engine.kernels.triton_moe import moe_split_k

    def plan(T, E, L, H, bk1=128, bk2=128):
        bm = scaled_tiles(T * 8, E).block_m
        return moe_split_k(moe_align_sizes(T * 8, E, bm)[1], L, H, 64, 64, bk1, bk2)

    assert plan(1, 384, 1024, 7168) == (9, 2)  # 8 blocks x 16 column tiles; L=1024 is 8 tiles
    assert plan(4, 384, 1024, 7168) == (3, 1)  # 32 x 16 = 512 gate/up programs; 3584 down ones
    assert plan(128, 384, 1024, 7168) == (1, 1)
    assert plan(8192, 384, 1024, 7168) == (1, 1)
    # the interpreted split case above (T=4, k=3 there): 2 slices of H, L too short
    assert moe_split_k(moe_align_sizes(12, 10, 16)[1], 96, 256, 64, 64, 32, 32) == (2, 1)


def test_rejects_bad_arguments():
    E, H, L = 4, 64, 32
    x = torch.zeros(2, H)
    ids = torch.zeros(2, 2, dtype=torch.long)
    wts = torch.ones(2, 2)
    w13, s13 = torch.zeros(E, 2 * L, H // 2, dtype=torch.uint8), torch.zeros(E, 2 * L, H // 32, dtype=torch.uint8)
    w2, s2 = torch.zeros(E, H, L // 2, dtype=torch.uint8), torch.zeros(E, H, L // 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="w2_scale"):
        fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2[:, :, :0])
    with pytest.raises(ValueError, match="block_k"):
        fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2, block_k=48)
    with pytest.raises(ValueError, match="split_k"):
        fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2, split_k=0)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [(None, None), (1, 1), (4, 2)])  # auto here: 8 slices of H, L whole
def test_on_cuda_without_host_sync(splits):
    """For a GPU run: real-sized H against float64, no host sync (sync debug mode), and CUDA-graph replay."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import torch.nn.functional as F

    from k2bench.engine.model.mxfp4 import dequantize_mxfp4, quantize_mxfp4

    E, H, L, k, T = 16, 7168, 512, 8, 5
    g = torch.Generator().manual_seed(0)
    w13, s13 = quantize_mxfp4(torch.randn(E, 2 * L, H, generator=g) * 0.02)
    w2, s2 = quantize_mxfp4(torch.randn(E, H, L, generator=g) * 0.02)
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    wts = torch.rand(T, k, generator=g)
    d13, d2 = dequantize_mxfp4(w13, s13).double(), dequantize_mxfp4(w2, s2).double()
    ref = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            h = d13[e] @ x[t].to(torch.bfloat16).double()
            h = (F.silu(h[:L]) * h[L:]).to(torch.bfloat16).double()
            ref[t] += float(wts[t, j]) * (d2[e] @ h)
    dev = [t.cuda() for t in (x, ids, wts, w13, s13, w2, s2)]
    kw = {"split_k": splits[0], "down_split_k": splits[1]}
    fused_moe_mxfp4(*dev, **kw)  # compile outside the sync check
    torch.cuda.synchronize()
    try:
        with warnings.catch_warnings():  # torch notes that the sync check is a prototype feature
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        got = fused_moe_mxfp4(*dev, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert float((got.double().cpu() - ref).abs().max() / ref.abs().max()) < 1e-3
    # shapes depend on T, k, E only, so one CUDA graph replays for new inputs of the same size
    static = [t.clone() for t in dev]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe_mxfp4(*static, **kw)
    static[0].copy_(dev[0] * 0.5)
    static[1].copy_(torch.roll(dev[1], 1, dims=0))
    graph.replay()
    eager = fused_moe_mxfp4(dev[0] * 0.5, torch.roll(dev[1], 1, dims=0), *dev[2:], **kw)
    assert torch.allclose(out, eager, rtol=1e-5, atol=1e-5 * float(eager.abs().max()))
