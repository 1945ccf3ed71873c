"""The float64 reference of the routed-expert MoE and its random test inputs, shared by the child
processes of test_triton_moe.py, test_triton_moe_fast.py and test_dense_mlp.py (which import it from this
folder; `kernel_cases.run_interpreted` starts such a child)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from k2bench.engine.model.mxfp4 import dequantize_mxfp4, fake_quantize_mxfp4, quantize_mxfp4


def reference(x, ids, wts, d13, d2, a4w4):
    L = d2.shape[2]
    xs = fake_quantize_mxfp4(x.float()).double() if a4w4 else x.to(torch.bfloat16).double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    flip = torch.zeros(x.shape, dtype=torch.float64)  # what the ambiguous bf16 roundings of h can move
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e, w = int(ids[t, j]), float(wts[t, j])
            g = d13[e] @ xs[t]
            h = F.silu(g[:L]) * g[L:]
            if a4w4:
                h = fake_quantize_mxfp4(h.float()).double()
            else:
                # within 1e-6 of a bf16 rounding midpoint, float32 noise may round the other way
                near = (h * (1 + 1e-6)).to(torch.bfloat16) != (h * (1 - 1e-6)).to(torch.bfloat16)
                h = h.to(torch.bfloat16).double()
                flip[t] += w * 2.0**-7 * (d2[e].abs() @ (h.abs() * near))
            out[t] += w * (d2[e] @ h)
    return out, flip


def make(seed, E, H, L):
    g = torch.Generator().manual_seed(seed)
    (w13, s13) = quantize_mxfp4(torch.randn(E, 2 * L, H, generator=g) * 0.1)
    (w2, s2) = quantize_mxfp4(torch.randn(E, H, L, generator=g) * 0.1)
    return g, (w13, s13, w2, s2), dequantize_mxfp4(w13, s13).double(), dequantize_mxfp4(w2, s2).double()


def routing(g, T, k, allowed, skew=None):
    ids = torch.stack([allowed[torch.randperm(len(allowed), generator=g)[:k]] for _ in range(T)])
    if skew is not None:  # every token's first choice is one expert: its group spans several blocks
        ids[:, 0] = skew
        ids[:, 1:] = torch.where(ids[:, 1:] == skew, allowed[0] if skew != allowed[0] else allowed[1], ids[:, 1:])
    return ids, torch.rand(T, k, generator=g)
