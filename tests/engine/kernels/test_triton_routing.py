"""The one-kernel expert routing (engine/kernels/triton_routing.py) against the torch backend's reference.

Same sigmoid scores in, so the chosen experts must be the same, in the same order (highest first),
and the weights equal up to the float32 order of the renormalising sum. Random scores have no ties.
The router's scores kernel (`router_scores`) against float64: within float32 rounding, and the experts
it leads to are the ones float64 scores choose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.engine

pytest.importorskip("triton")

# (T, E, top_k, n_group, topk_group, renormalize): Kimi-K2 (one group, 8 of 384), DeepSeek-V3-like groups,
# the tiny checkpoint's shape, a k that is not a power of two, one expert per group
SHAPES = [(9, 384, 8, 1, 1, True), (6, 256, 8, 8, 4, True), (5, 12, 3, 4, 2, True), (4, 64, 6, 8, 3, False),
          (3, 16, 2, 16, 5, True), (0, 384, 8, 1, 1, True)]

CHILD = r"""
import json, sys, torch
from k2bench.engine.kernels.torch_backend import TorchBackend
from k2bench.engine.kernels.triton_routing import route_experts

out = []
g = torch.Generator().manual_seed(0)
for T, E, k, ng, tg, renorm in json.loads(sys.argv[1]):
    scores = torch.rand(T, E, generator=g)
    bias = torch.randn(E, generator=g) * 0.05
    kw = dict(top_k=k, n_group=ng, topk_group=tg, renormalize=renorm, scale=2.827)
    w0, i0 = TorchBackend().route_experts(scores, bias, **kw)
    w1, i1 = route_experts(scores, bias, **kw)
    out.append({"shape": [T, E, k, ng, tg], "ids_equal": torch.equal(i0, i1), "dtype": str(i1.dtype),
                "w_err": float((w0 - w1).abs().max()) if T else 0.0, "w_max": float(w0.abs().max()) if T else 1.0})
print("RESULT" + json.dumps(out))
"""


def _check(rows: list[dict]) -> None:
    assert len(rows) == len(SHAPES)
    for r in rows:
        assert r["ids_equal"], r
        assert r["dtype"] == "torch.int64", r
        assert r["w_err"] <= 1e-6 * r["w_max"], r


def test_routing_kernel_matches_torch_reference_under_interpreter():
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(SHAPES)], env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT"):]))


def test_routing_rejects_shapes_it_cannot_split():
    from k2bench.engine.kernels.triton_routing import route_experts

    with pytest.raises(ValueError, match="n_group"):
        route_experts(torch.rand(2, 10), torch.zeros(10), top_k=2, n_group=4, topk_group=1, renormalize=True, scale=1.0)


@pytest.mark.gpu
def test_routing_kernel_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from k2bench.engine.kernels.torch_backend import TorchBackend
    from k2bench.engine.kernels.triton_routing import route_experts

    rows = []
    g = torch.Generator().manual_seed(1)
    for T, E, k, ng, tg, renorm in SHAPES:
        scores = torch.rand(T, E, generator=g).cuda()
        bias = (torch.randn(E, generator=g) * 0.05).cuda()
        kw = dict(top_k=k, n_group=ng, topk_group=tg, renormalize=renorm, scale=2.827)
        w0, i0 = TorchBackend("cuda").route_experts(scores, bias, **kw)
        w1, i1 = route_experts(scores, bias, **kw)
        rows.append({"ids_equal": torch.equal(i0, i1), "dtype": str(i1.dtype),
                     "w_err": float((w0 - w1).abs().max()) if T else 0.0, "w_max": float(w0.abs().max()) if T else 1.0})
    _check(rows)


# (T, E, H): Kimi-K2.5's router (384 x 7168) at one token, 17 tokens (past one 16-token block), a small
# odd shape, no token, and a count above ROUTER_KERNEL_MAX_T (torch's GEMM)
ROUTER_SHAPES = [(1, 384, 7168), (17, 64, 1024), (5, 13, 96), (0, 8, 32), (130, 12, 64)]

ROUTER_CHILD = r"""
import json, sys, torch
from k2bench.engine.kernels.triton_routing import route_experts, router_scores

out = []
g = torch.Generator().manual_seed(3)
for T, E, H in json.loads(sys.argv[1]):
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    w = torch.randn(E, H, generator=g) / H ** 0.5
    got = router_scores(x, w)
    ref = torch.sigmoid(x.double() @ w.double().T)
    row = {"shape": [T, E, H], "dtype": str(got.dtype), "size": list(got.shape),
           "err": float((got.double() - ref).abs().max()) if T else 0.0}
    if T and E >= 8:
        kw = dict(top_k=8, n_group=1, topk_group=1, renormalize=True, scale=1.0)
        bias = torch.zeros(E)
        row["ids_equal"] = torch.equal(route_experts(got, bias, **kw)[1], route_experts(ref.float(), bias, **kw)[1])
    out.append(row)
try:
    router_scores(torch.zeros(2, 64), torch.zeros(8, 32))
    out.append({"refused": ""})
except ValueError as exc:
    out.append({"refused": str(exc)})
print("RESULT" + json.dumps(out))
"""


def _check_router(rows: list[dict]) -> None:
    *rows, refused = rows
    assert "against a weight of (8, 32)" in refused["refused"]
    assert len(rows) == len(ROUTER_SHAPES)
    for r, (T, E, _) in zip(rows, ROUTER_SHAPES, strict=True):
        assert r["dtype"] == "torch.float32" and r["size"] == [T, E], r
        assert r["err"] <= 2e-6, r  # float32 sums of up to 7168 products, against float64
        assert r.get("ids_equal", True), r


def test_router_scores_against_float64_under_interpreter():
    proc = subprocess.run([sys.executable, "-c", ROUTER_CHILD, json.dumps(ROUTER_SHAPES)],
                          env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_router(json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT"):]))


@pytest.mark.gpu
def test_router_scores_on_cuda():
    """At Kimi-K2.5 width on the GPU: within float32 rounding of float64 at every decode size, the same
    experts as float64 scores and as torch's float32 GEMM, and a CUDA-graph replay equal to the eager call."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from k2bench.engine.kernels.torch_backend import TorchBackend
    from k2bench.engine.kernels.triton_routing import route_experts, router_scores

    g = torch.Generator().manual_seed(4)
    w = (torch.randn(384, 7168, generator=g) / 7168 ** 0.5).cuda()
    kw = dict(top_k=8, n_group=1, topk_group=1, renormalize=True, scale=2.827)
    bias = torch.zeros(384, device="cuda")
    for T in (1, 4, 32, 128, 129):
        x = torch.randn(T, 7168, generator=g).to(torch.bfloat16).cuda()
        got = router_scores(x, w)
        ref = torch.sigmoid(x.double() @ w.double().T)
        assert float((got.double() - ref).abs().max()) <= 2e-6, T
        ids = route_experts(got, bias, **kw)[1]
        assert torch.equal(ids, route_experts(ref.float(), bias, **kw)[1]), T
        assert torch.equal(ids, route_experts(TorchBackend("cuda").router_scores(x, w), bias, **kw)[1]), T
    static = torch.randn(4, 7168, generator=g).to(torch.bfloat16).cuda()
    router_scores(static, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = router_scores(static, w)
    static.copy_(static * 0.5)
    graph.replay()
    assert torch.equal(out, router_scores(static, w))
