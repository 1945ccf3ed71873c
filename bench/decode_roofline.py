"""Decode step time of each sweep level against the memory roofline of the bundled engine.

A decode step must read, on each rank, every weight it uses once (the replicated ones whole, the
tensor-parallel ones as this rank's slice; routed experts only if some token of the batch picked
them) and the latent KV cache of every running sequence. bytes / measured bandwidth is the floor
of that step's time; the sweep's median TPOT is the step time a user saw (it includes prefill
chunks that share steps, so it is an upper bound on the pure decode step).

Byte counts come from the checkpoint's own tensors (safetensors headers; nothing is loaded), so the
same script serves the tiny model and the full-width one.

    python bench/decode_roofline.py --model DIR --tp 4 --run run.json --bandwidth-gbs 4300 [--out roofline.json]
"""

from __future__ import annotations

import argparse
import json
import re
import struct
from collections import defaultdict
from pathlib import Path

# Tensors split across ranks (on their output or input dim); everything else is replicated.
_SPLIT = re.compile(r"(q_b_proj|q_proj|kv_b_proj|o_proj|gate_proj|up_proj|down_proj|lm_head)\.(weight|weight_scale)$")
_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")
_LAYER = re.compile(r"layers\.(\d+)\.")


def tensor_bytes(model_dir: Path) -> dict[str, int]:
    """name -> stored bytes, read from the safetensors headers (8-byte length + JSON)."""
    sizes: dict[str, int] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                lo, hi = info["data_offsets"]
                sizes[name] = hi - lo
    return sizes


def step_bytes(sizes: dict[str, int], cfg: dict, tp: int, batch: int, ctx: float, kv_bytes: int) -> dict[str, float]:
    """Bytes one rank must read in one decode step of `batch` sequences with mean context `ctx`."""
    text = cfg.get("text_config", cfg)
    experts = int(text.get("n_routed_experts") or 0)
    topk = int(text.get("num_experts_per_tok") or 0)
    layers = int(text["num_hidden_layers"])
    kv_dim = int(text["kv_lora_rank"]) + int(text["qk_rope_head_dim"])
    per_expert_layer: dict[int, int] = defaultdict(int)  # layer -> bytes of all its experts on this rank
    fixed = 0.0
    for name, nbytes in sizes.items():
        share = nbytes / tp if _SPLIT.search(name) else nbytes
        if "embed_tokens" in name:
            share = nbytes / int(text["vocab_size"]) * batch  # only the rows of this step's tokens
        if _EXPERT.search(name):
            per_expert_layer[int(_LAYER.search(name).group(1))] += share
        else:
            fixed += share
    # Expected distinct experts touched when `batch` tokens each pick `topk` of `experts` (uniform routing).
    touched = experts * (1 - (1 - topk / experts) ** batch) if experts else 0.0
    expert_bytes = sum(b / experts * touched for b in per_expert_layer.values()) if experts else 0.0
    kv = batch * ctx * kv_dim * kv_bytes * layers  # the latent is not split across ranks
    return {"weights_fixed": fixed, "experts": expert_bytes, "kv": kv, "total": fixed + expert_bytes + kv,
            "experts_touched": touched}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--run", required=True, type=Path, help="k2bench.run/1 JSON of the sweep")
    ap.add_argument("--bandwidth-gbs", type=float, required=True, help="measured device memory bandwidth, GB/s")
    ap.add_argument("--kv-bytes", type=int, default=2, help="bytes per cached value (2 = bf16, 1 = fp8)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    cfg = json.loads((args.model / "config.json").read_text())
    sizes = tensor_bytes(args.model)
    doc = json.loads(args.run.read_text())
    isl, osl = doc["run"]["isl"], doc["run"]["osl"]
    rows = []
    for p in sorted(doc["points"], key=lambda p: p["concurrency"]):
        b = step_bytes(sizes, cfg, args.tp, p["concurrency"], isl + osl / 2, args.kv_bytes)
        floor_ms = b["total"] / (args.bandwidth_gbs * 1e9) * 1e3
        tpot = p["tpot_ms"]["median"]
        rows.append({
            "concurrency": p["concurrency"], "completed": p["completed"], "tput_per_gpu": p["tput_per_gpu"],
            "tok_s_user": p["interactivity"]["median"], "tpot_ms_median": tpot,
            "bytes_per_step_GB": b["total"] / 1e9, "weights_GB": (b["weights_fixed"] + b["experts"]) / 1e9,
            "kv_GB": b["kv"] / 1e9, "experts_touched": b["experts_touched"],
            "roofline_ms": floor_ms, "x_roofline": tpot / floor_ms if floor_ms else None,
            "achieved_GBs": b["total"] / (tpot / 1e3) / 1e9 if tpot else None,
        })
    head = (f"{'conc':>5} {'done':>5} {'tok/s/GPU':>10} {'tok/s/user':>10} {'TPOT ms':>9} {'GB/step':>8} "
            f"{'experts':>8} {'floor ms':>9} {'x floor':>8} {'GB/s':>8}")
    print(head)
    for r in rows:
        print(f"{r['concurrency']:>5} {r['completed']:>5} {r['tput_per_gpu']:>10.1f} {r['tok_s_user']:>10.2f} "
              f"{r['tpot_ms_median']:>9.2f} {r['bytes_per_step_GB']:>8.3f} {r['experts_touched']:>8.1f} "
              f"{r['roofline_ms']:>9.3f} {r['x_roofline']:>8.1f} {r['achieved_GBs']:>8.1f}")
    if args.out:
        args.out.write_text(json.dumps({"bandwidth_gbs": args.bandwidth_gbs, "tp": args.tp, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
