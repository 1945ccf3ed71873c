"""The one-kernel expert routing (engine/kernels/triton_routing.py) against the torch backend's reference.

Same sigmoid scores in, so the chosen experts must be the same, in the same order (highest first),
and the weights equal up to the float32 order of the renormalising sum. Random scores have no ties.
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
