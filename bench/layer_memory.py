"""What one layer of the model holds on a device, per tensor-parallel rank, and what a full-depth model needs.

The model is loaded as `k2bench serve` loads it (triton backend on a GPU, so the routed experts and the dense
MLPs, layer 0's and the shared experts, are re-laid into the fast layout at load and their checkpoint copy is
released: each is held once), once per TP size as rank 0 of that size (loading one rank's shards needs no
process group). Each dense MLP is run once on one token through the backend, as the first decode step does,
so any copy the backend builds on first use is counted too: with --keep-dense (K2BENCH_KEEP_DENSE_CHECKPOINT=1)
the dense MLPs keep their checkpoint tensors and that first decode builds the fast copy beside them, the
double holding of before, for comparison.
Bytes are counted per layer and per part (attention, dense MLP, shared expert, router, routed experts,
norms), parameters plus the backend's own copies of them, and checked against the allocator's figure.

The projection to a full-depth model: non-layer tensors (embedding, final norm, lm_head) once, the dense
layers' bytes times the model's first_k_dense_replace, the MoE layers' bytes (measured layers 1.. all hold
the same shapes) times the rest, plus the latent KV cache per token (kv_cache_dim x layers x bytes). The
checkpoint only needs the real width (`k2bench engine tiny --preset kimi-k2-width --layers 3`); the depth
comes from --full-layers / --full-dense.

    python bench/layer_memory.py --model /tmp/k2-width-3 --tp 1,4,8 --full-layers 61 --full-dense 1 --out /tmp/out
    python bench/layer_memory.py --model /tmp/k2-width-3 --tp 1 --keep-dense --out /tmp/out-kept
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from k2bench.engine.model.loader import load_model
from k2bench.engine.model.moe import KEEP_DENSE_ENV, DenseMLP

GIB = 1024**3


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _part(name: str) -> str:
    """A layer's parameter name -> the part it belongs to."""
    if name.startswith("self_attn."):
        return "attention"
    if name.startswith("mlp.experts."):
        return "routed_experts"
    if name.startswith("mlp.shared_experts."):
        return "shared_expert"
    if name.startswith("mlp.gate."):
        return "router"
    if name.startswith("mlp."):
        return "dense_mlp"
    return "norms"


def _backend_copies(backend) -> dict[int, int]:
    """id(w13) -> bytes of the backend's own layout of that stack (routed experts and dense MLPs)."""
    out: dict[int, int] = {}
    for cache in (getattr(backend, "_fast", {}), getattr(backend, "_dense", {})):
        for key, (_ref, fast) in cache.items():
            if fast is not None:
                out[key] = out.get(key, 0) + sum(_bytes(t) for t in (fast.w13, fast.s13, fast.w2, fast.s2))
    return out


def _touch_dense(model, device: torch.device) -> None:
    """Run every dense MLP (dense layers and shared experts) on one token through the backend, without the
    all-reduce, so what the first decode step builds exists before counting."""
    hidden = model.cfg.hidden_size
    x = torch.zeros(1, hidden, dtype=model.par.dtype, device=device)
    for m in model.modules():
        if isinstance(m, DenseMLP):
            gu, down = m.gate_up, m.down
            model.par.backend.dense_mlp(x, gu.weight, gu.weight_scale, down.weight, down.weight_scale,
                                        a4w4=model.par.a4w4)


def measure(model_dir: str, device: torch.device, tp: int, backend: str) -> dict:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
    model, cfg = load_model(model_dir, device=device, backend=backend, tp_rank=0, tp_size=tp)
    _touch_dense(model, device)
    if cuda:
        torch.cuda.synchronize(device)
    copies = _backend_copies(model.par.backend)
    layers = []
    for i, layer in enumerate(model.layers):
        parts: dict[str, int] = {}
        for name, p in layer.named_parameters():
            part = _part(name)
            parts[part] = parts.get(part, 0) + _bytes(p)
            if id(p) in copies:  # the backend's layout of the stack whose w13 this is
                parts[f"{part}_backend_copy"] = parts.get(f"{part}_backend_copy", 0) + copies[id(p)]
        layers.append({"layer": i, "dense": i < cfg.first_k_dense_replace, "bytes": sum(parts.values()), "parts": parts})
    in_layers = {id(p) for layer in model.layers for p in layer.parameters()}
    other = sum(_bytes(p) for p in model.parameters() if id(p) not in in_layers)
    counted = other + sum(r["bytes"] for r in layers)
    row = {"tp": tp, "non_layer_bytes": other, "layers": layers, "counted_bytes": counted,
           "allocated_bytes": torch.cuda.memory_allocated(device) - base if cuda else None,
           "kv_bytes_per_token_per_layer": cfg.kv_cache_dim * 2}
    del model
    if cuda:
        torch.cuda.empty_cache()
    return row


def project(row: dict, full_layers: int, full_dense: int, kv_tokens: int) -> dict:
    """A full-depth model's bytes on one rank from the measured layers (see the module docstring)."""
    dense = [r["bytes"] for r in row["layers"] if r["dense"]]
    moe = [r["bytes"] for r in row["layers"] if not r["dense"]]
    if not dense or not moe:
        raise SystemExit("the checkpoint needs at least one dense and one MoE layer to project from")
    weights = row["non_layer_bytes"] + max(dense) * full_dense + max(moe) * (full_layers - full_dense)
    kv = row["kv_bytes_per_token_per_layer"] * full_layers * kv_tokens
    return {"tp": row["tp"], "dense_layer_gib": max(dense) / GIB, "moe_layer_gib": max(moe) / GIB,
            "non_layer_gib": row["non_layer_bytes"] / GIB, "weights_gib": weights / GIB, "kv_tokens": kv_tokens,
            "kv_gib": kv / GIB, "total_gib": (weights + kv) / GIB}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", default="1", help="comma list of TP sizes, each measured as its rank 0")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default=None, help="default: triton on a GPU (as serve), torch on CPU")
    ap.add_argument("--full-layers", type=int, default=61, help="depth to project to (Kimi-K2.5: 61)")
    ap.add_argument("--full-dense", type=int, default=1, help="dense layers of the full model (Kimi-K2.5: 1)")
    ap.add_argument("--kv-tokens", type=int, default=128 * 9216,
                    help="cached tokens per rank in the projection (default: 128 sequences of 8k+1k)")
    ap.add_argument("--keep-dense", action="store_true",
                    help=f"dense MLPs keep their checkpoint tensors ({KEEP_DENSE_ENV}=1), as before they were released")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.keep_dense:
        os.environ[KEEP_DENSE_ENV] = "1"
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    backend = args.backend or ("triton" if device.type == "cuda" else "torch")
    rows, proj = [], []
    doc = {"model": args.model, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "backend": backend, "keep_dense": args.keep_dense, "measured": rows, "projection": proj}
    for tp in (int(t) for t in args.tp.split(",")):
        row = measure(args.model, device, tp, backend)
        rows.append(row)
        proj.append(project(row, args.full_layers, args.full_dense, args.kv_tokens))
        (args.out / "layer_memory.json").write_text(json.dumps(doc, indent=1))  # after each size: a cut run keeps them
        alloc = row["allocated_bytes"]
        print(f"tp {tp} rank 0: counted {row['counted_bytes'] / GIB:.3f} GiB"
              + (f", allocator {alloc / GIB:.3f} GiB" if alloc is not None else ""), flush=True)
        for r in row["layers"]:
            parts = "  ".join(f"{k} {v / 2**20:.1f}" for k, v in sorted(r["parts"].items()))
            print(f"  layer {r['layer']} ({'dense' if r['dense'] else 'moe'}): {r['bytes'] / 2**20:.1f} MiB = {parts}")
    print(f"\nfull depth ({args.full_layers} layers, {args.full_dense} dense), per GPU, KV for {args.kv_tokens} tokens:")
    print(f"{'tp':>3} {'dense layer':>12} {'moe layer':>10} {'non-layer':>10} {'weights':>9} {'kv':>8} {'total GiB':>10}")
    for p in proj:
        print(f"{p['tp']:>3} {p['dense_layer_gib']:>12.3f} {p['moe_layer_gib']:>10.3f} {p['non_layer_gib']:>10.3f} "
              f"{p['weights_gib']:>9.2f} {p['kv_gib']:>8.2f} {p['total_gib']:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
