"""The MoE router's scores alone on one GPU at Kimi-K2.5 width (384 experts, H = 7168, float32 weight):
torch's float32 GEMM and sigmoid (the torch backend, and the triton backend past ROUTER_KERNEL_MAX_T)
against `triton_routing.router_scores`, each captured in a CUDA graph and replayed (median of CUDA-event
timings), against the weight's byte floor; checks each against float64. Prints a table, writes router.json.

    python bench/router_bench.py --tokens 1,4,32,64,128 --out /tmp/out
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_gpu_bench import copy_bandwidth_gbs  # noqa: E402
from engine_moe_gpu_bench import graph_time_ms  # noqa: E402

from k2bench.engine.kernels.triton_routing import ROUTER_KERNEL_MAX_T, router_scores  # noqa: E402

E, H = 384, 7168


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,4,32,64,128")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth_gbs()
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(E, H, device="cuda", generator=g) / H**0.5
    floor_ms = w.numel() * 4 / (bw * 1e9) * 1e3
    print(f"copy bandwidth {bw:.0f} GB/s; router {E} x {H} float32, floor {floor_ms * 1e3:.1f} us "
          f"(kernel up to {ROUTER_KERNEL_MAX_T} tokens)", flush=True)
    rows = []
    for T in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
        ref = torch.sigmoid(x.double() @ w.double().T)
        for name, fn in (("torch", lambda x=x: F.linear(x.float(), w).sigmoid()),
                         ("router_scores", lambda x=x: router_scores(x, w))):
            err = float((fn().double() - ref).abs().max())
            ms = graph_time_ms(fn, args.reps)
            rows.append({"T": T, "path": name, "us": ms * 1e3, "floor_us": floor_ms * 1e3, "x_floor": ms / floor_ms,
                         "max_err_vs_float64": err})
            print(f"T={T:>4} {name:<14} {ms * 1e3:7.1f} us  x{ms / floor_ms:5.1f} floor  err {err:.1e}", flush=True)
    (args.out / "router.json").write_text(json.dumps({"bandwidth_gbs": bw, "E": E, "H": H, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
