"""The routed experts and the dense MLPs are held once: a backend that re-lays them at load releases the
checkpoint copy.

At Kimi-K2.5 width the experts are almost all of a layer's bytes, so keeping the checkpoint layout next to
the fast one (as the triton backend did) doubled the model's memory; the dense MLPs (layer 0's, the shared
experts) were held twice until their prefill batches could be served from the fast copy too. Loaded on the
triton backend's H200 path (the fast layout; under TRITON_INTERPRET=1 on CPU here), the tiny MXFP4 model must
hold no more parameter bytes than the same checkpoint loaded for the torch backend, keep no checkpoint tensor
of any expert or dense MLP, still give the torch backend's logits and greedy tokens through prefill steps
(the dequantised path, with DEQUANT_MIN_M lowered so the tiny prompts reach it) and decode steps, and refuse
clearly when another backend is swapped in afterwards. With K2BENCH_KEEP_DENSE_CHECKPOINT=1 the dense MLPs
keep their tensors and the first decode builds the copy beside them, as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine

CHILD = r'''
import json, os, sys
import torch
from model_helpers import PagedDriver

import k2bench.engine.kernels.triton_backend as tb
from k2bench.engine.kernels import get_backend
from k2bench.engine.model.loader import load_model
from k2bench.engine.model.moe import KEEP_DENSE_ENV, DenseMLP, Experts
from k2bench.engine.model.tiny import TinySpec, write_tiny_checkpoint

torch.set_num_threads(1)
tb.DEQUANT_MIN_M = 4  # the prefill steps (8 rows) take the dequantised path, the decode steps (2 rows) the fast MoE
ckpt = write_tiny_checkpoint(sys.argv[1], quant="mxfp4", seed=7, spec=TinySpec(layers=2))


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def held(model):
    # Bytes of the model's parameters plus every copy its backend keeps (routed stacks, dense MLPs).
    params = nbytes(model.parameters())
    backend = model.par.backend
    copies = {k: sum(nbytes((f.w13, f.s13, f.w2, f.s2)) for _r, f in getattr(backend, k, {}).values()
                     if f is not None) for k in ("_fast", "_dense")}
    of = lambda cls: nbytes(p for m in model.modules() if isinstance(m, cls) for p in m.parameters())
    return {"total": params + sum(copies.values()), "copies": copies["_fast"], "dense_copies": copies["_dense"],
            "expert_params": of(Experts), "dense_params": of(DenseMLP),
            "dense_mlps": sum(isinstance(m, DenseMLP) for m in model.modules())}


def greedy(model, cfg, steps=3):
    # The last logits and the greedy tokens of two sequences: one prefill step, then `steps` decode steps.
    drv = PagedDriver(model, cfg)
    logits = drv.step([(0, [1, 2, 3, 4, 5]), (1, [7, 8, 9])])
    tokens = []
    for _ in range(steps):
        nxt = logits.argmax(-1).tolist()
        tokens.append(nxt)
        logits = drv.step([(0, [nxt[0]]), (1, [nxt[1]])])
    return logits, tokens


out = {}
ref_model, cfg = load_model(ckpt, dtype="float32", backend="torch", quant_mode="a4w4")
ref, out["torch_tokens"] = greedy(ref_model, cfg)
out["torch"] = held(ref_model)
for name, variant, keep in (("fast", "fast", False), ("fast_keep", "fast", True), ("kept", "dot_scaled", False)):
    tb.TritonBackend._moe_variant = lambda self, device, v=variant: v  # the H200's choice (fast), or not
    if keep:
        os.environ[KEEP_DENSE_ENV] = "1"
    model, cfg = load_model(ckpt, dtype="float32", backend="triton", quant_mode="a4w4")
    os.environ.pop(KEEP_DENSE_ENV, None)
    out[name] = {"at_load": held(model)}
    got, tokens = greedy(model, cfg)
    out[name].update(held(model))
    out[name]["rel_err"] = float((got - ref).abs().max() / ref.abs().max())
    out[name]["tokens"] = tokens
    if name == "fast":
        object.__setattr__(model.par, "backend", get_backend("torch", "cpu"))
        try:
            greedy(model, cfg, steps=1)
            out["swap"] = ""
        except RuntimeError as exc:
            out["swap"] = str(exc)
print("RESULT" + json.dumps(out))
'''


def test_fast_layout_replaces_the_checkpoint_experts_and_dense_mlps(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "tiny")], env=env, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT"):])
    torch_b, fast, keep, kept = res["torch"], res["fast"], res["fast_keep"], res["kept"]
    assert torch_b["copies"] == torch_b["dense_copies"] == 0 and torch_b["expert_params"] > 0
    assert torch_b["dense_mlps"] == 2 and torch_b["dense_params"] > 0  # layer 0's MLP, layer 1's shared experts
    # the fast path: no checkpoint experts or dense MLPs left from load on, their own copies no bigger than them
    # (H and each intermediate size are whole 64-chunks)
    for r in (fast["at_load"], fast):
        assert r["expert_params"] == 0 and r["dense_params"] == 0, res
        assert r["copies"] == torch_b["expert_params"] and r["dense_copies"] == torch_b["dense_params"], res
        assert r["total"] == torch_b["total"], res
    # kept dense tensors (the switch): the copy built on first decode sits beside them, the old double holding
    assert keep["at_load"]["dense_copies"] == 0 and keep["at_load"]["total"] == torch_b["total"]
    assert keep["dense_params"] == keep["dense_copies"] == torch_b["dense_params"]
    assert keep["total"] == torch_b["total"] + torch_b["dense_params"]
    # a variant on the checkpoint layout keeps it and builds no copy
    assert kept["copies"] == kept["dense_copies"] == 0 and kept["total"] == torch_b["total"]
    for r in (fast, keep, kept):
        assert r["rel_err"] < 1e-4 and r["tokens"] == res["torch_tokens"], res
    assert "released at load" in res["swap"] and "backend='torch'" in res["swap"]
    assert "K2BENCH_KEEP_DENSE_CHECKPOINT=1" in res["swap"]  # layer 0's dense MLP is the first to refuse
