"""A dense SwiGLU MLP (layer 0's MLP, the shared experts) through `KernelBackend.dense_mlp`: on the triton
backend's fast variant it runs as a one-expert fused MoE on the fast weight layout; checked under
TRITON_INTERPRET=1 against the float64 reference of the routed MoE (one expert, weight 1) and against the
torch backend, whose linears it replaces. Large batches keep the dequantise + cuBLAS path."""

from __future__ import annotations

import pytest

# the interpreted kernel run behind the module fixture may take minutes on a loaded 2-core machine
pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

pytest.importorskip("triton")

from kernel_cases import run_interpreted  # noqa: E402  (this folder; after the importorskip)

CHILD = r"""
import json, torch
from k2bench.engine.kernels.torch_backend import TorchBackend
from k2bench.engine.kernels.triton_backend import DEQUANT_MIN_M, TritonBackend
from moe_reference import make, reference

torch.set_num_threads(1)
b = TritonBackend()
b.moe_variant = "fast"
cases = []
# (H, L, rows): H=512 splits gate/up's K in two (moe_dispatch.split_k); rows 20 take the batched tiles
for si, (H, L, T) in enumerate([(128, 64, 3), (512, 256, 3), (256, 192, 20)]):
    g, w, d13, d2 = make(40 + si, 1, H, L)
    w13, s13, w2, s2 = (t[0] for t in w)  # one expert = the dense MLP's [2L, H/2] and [H, L/2] weights
    x = torch.randn(T, H, generator=g) * 2
    ids, wts = torch.zeros(T, 1, dtype=torch.int64), torch.ones(T, 1)
    for dtype, a4w4 in [(torch.float32, False), (torch.float32, True), (torch.bfloat16, True)]:
        xd = x.to(dtype)
        ref, flip = reference(xd, ids, wts, d13, d2, a4w4)
        got = b.dense_mlp(xd, w13, s13, w2, s2, a4w4=a4w4)
        tol = 1e-5 * ref.abs().max() + flip
        if dtype == torch.bfloat16:
            tol = tol + 2.0**-8 * ref.abs()
        row = {"case": [H, L, T, str(dtype), a4w4], "dtype_ok": got.dtype == dtype and list(got.shape) == [T, H],
               "worst": float(((got.double() - ref).abs() / tol).max())}
        if dtype == torch.float32 and a4w4:  # MXFP4 activations are exact in bf16: the torch path agrees
            want = TorchBackend().dense_mlp(xd, w13, s13, w2, s2, a4w4=True)
            row["vs_torch"] = float((got - want).abs().max() / want.abs().max())
        cases.append(row)
cached = {"layouts": len(b._dense), "routing_buffers": b._one_expert[0].shape[0]}
# a prefill-sized batch keeps the linear path (dequantise + BLAS), bit for bit
g, w, _, _ = make(7, 1, 128, 64)
w13, s13, w2, s2 = (t[0] for t in w)
x = torch.randn(DEQUANT_MIN_M, 128, generator=g)
big = b.dense_mlp(x, w13, s13, w2, s2, a4w4=True)
linear = TorchBackend.dense_mlp(b, x, w13, s13, w2, s2, a4w4=True)
print("RESULT" + json.dumps({"cases": cases, "cached": cached, "large_same": bool(torch.equal(big, linear)),
                             "layouts_after_large": len(b._dense)}))
"""


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(CHILD)


def test_dense_mlp_matches_float64_reference(interpreted):
    assert len(interpreted["cases"]) == 9
    for case in interpreted["cases"]:
        assert case["dtype_ok"], case
        assert case["worst"] <= 1.0, case


def test_dense_mlp_matches_torch_backend_in_a4w4(interpreted):
    rows = [c for c in interpreted["cases"] if "vs_torch" in c]
    assert len(rows) == 3
    assert all(c["vs_torch"] < 1e-5 for c in rows), rows


def test_layout_built_once_per_mlp_and_routing_reused(interpreted):
    assert interpreted["cached"] == {"layouts": 3, "routing_buffers": 1024}


def test_prefill_batches_keep_the_dequantised_blas_path(interpreted):
    assert interpreted["large_same"]
    assert interpreted["layouts_after_large"] == 3  # no fast layout was built for it


@pytest.mark.gpu
@pytest.mark.parametrize("inter", [2048, 18432])  # a Kimi-K2.5 shared expert, its dense layer-0 MLP
def test_dense_mlp_at_kimi_width_on_cuda(inter):
    """On a GPU at H=7168: the fast one-expert path against the torch backend's linears in float32 A4W4
    (exact activations, so only summation order differs), at decode and batched sizes, eagerly and
    replayed from a CUDA graph."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from k2bench.engine.kernels.torch_backend import TorchBackend
    from k2bench.engine.kernels.triton_backend import TritonBackend
    from k2bench.engine.model.mxfp4 import quantize_mxfp4

    H = 7168
    g = torch.Generator().manual_seed(inter)
    w13, s13 = (t.cuda() for t in quantize_mxfp4(torch.randn(2 * inter, H, generator=g) * 0.02))
    w2, s2 = (t.cuda() for t in quantize_mxfp4(torch.randn(H, inter, generator=g) * 0.02))
    b = TritonBackend("cuda")
    assert b._moe_variant(torch.device("cuda")) == "fast"
    for rows in (4, 128):
        x = torch.randn(rows, H, generator=g).cuda()
        want = TorchBackend("cuda").dense_mlp(x, w13, s13, w2, s2, a4w4=True)
        got = b.dense_mlp(x, w13, s13, w2, s2, a4w4=True)
        assert (got - want).abs().max() / want.abs().max() < 1e-5, rows
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = b.dense_mlp(x, w13, s13, w2, s2, a4w4=True)
        x.copy_(torch.randn(rows, H, generator=g).cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, b.dense_mlp(x, w13, s13, w2, s2, a4w4=True)), rows
    assert len(b._dense) == 1
