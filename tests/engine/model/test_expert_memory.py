"""The routed experts are held once: a backend that re-lays them at load releases the checkpoint copy.

At Kimi-K2.5 width the experts are almost all of a layer's bytes, so keeping the checkpoint layout next to
the fast one (as the triton backend did) doubled the model's memory. Loaded on the triton backend's H200
path (the fast layout; under TRITON_INTERPRET=1 on CPU here), the tiny MXFP4 model must hold no more
parameter bytes than the same checkpoint loaded for the torch backend, still give the torch backend's
logits, and refuse clearly when another backend is swapped in afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine

CHILD = r'''
import json, sys
import torch
from model_helpers import PagedDriver

import k2bench.engine.kernels.triton_backend as tb
from k2bench.engine.kernels import get_backend
from k2bench.engine.model.loader import load_model
from k2bench.engine.model.moe import Experts
from k2bench.engine.model.tiny import TinySpec, write_tiny_checkpoint

torch.set_num_threads(1)
ckpt = write_tiny_checkpoint(sys.argv[1], quant="mxfp4", seed=7, spec=TinySpec(layers=2))


def held(model):
    """Bytes of the model's parameters plus every expert copy its backend keeps."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    copies = 0
    for _ref, fast in getattr(model.par.backend, "_fast", {}).values():
        if fast is not None:
            copies += sum(t.numel() * t.element_size() for t in (fast.w13, fast.s13, fast.w2, fast.s2))
    experts = sum(p.numel() * p.element_size() for m in model.modules() if isinstance(m, Experts)
                  for p in m.parameters())
    return {"total": params + copies, "copies": copies, "expert_params": experts}


def logits(model, cfg):
    drv = PagedDriver(model, cfg)
    drv.step([(0, [1, 2, 3, 4, 5]), (1, [7, 8, 9])])
    return drv.step([(0, [6]), (1, [10])])


out = {}
ref_model, cfg = load_model(ckpt, dtype="float32", backend="torch", quant_mode="a4w4")
ref = logits(ref_model, cfg)
out["torch"] = held(ref_model)
for name, variant in (("fast", "fast"), ("kept", "dot_scaled")):
    tb.TritonBackend._moe_variant = lambda self, device, v=variant: v  # the H200's choice (fast), or not
    model, cfg = load_model(ckpt, dtype="float32", backend="triton", quant_mode="a4w4")
    got = logits(model, cfg)
    out[name] = held(model)
    out[name]["rel_err"] = float((got - ref).abs().max() / ref.abs().max())
    out[name]["greedy_same"] = bool(torch.equal(got.argmax(-1), ref.argmax(-1)))
    if name == "fast":
        object.__setattr__(model.par, "backend", get_backend("torch", "cpu"))
        try:
            logits(model, cfg)
            out["swap"] = ""
        except RuntimeError as exc:
            out["swap"] = str(exc)
print("RESULT" + json.dumps(out))
'''


def test_fast_layout_replaces_the_checkpoint_experts(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "tiny")], env=env, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT"):])
    torch_b, fast, kept = res["torch"], res["fast"], res["kept"]
    assert torch_b["copies"] == 0 and torch_b["expert_params"] > 0
    # the fast path: no checkpoint experts left, its own copy no bigger than them (H, L are whole 64-chunks)
    assert fast["expert_params"] == 0
    assert fast["copies"] == torch_b["expert_params"]
    assert fast["total"] == torch_b["total"], res
    # a variant on the checkpoint layout keeps it and builds no copy
    assert kept["copies"] == 0 and kept["total"] == torch_b["total"]
    for r in (fast, kept):
        assert r["rel_err"] < 1e-4 and r["greedy_same"], res
    assert "released at load" in res["swap"] and "backend='torch'" in res["swap"]
