"""What a prefill chunk of a new length costs the host, call by call (the cuDNN SDPA plan question).

The triton backend's `prefill_attention` runs on PyTorch's fused SDPA kernels; cuDNN's builds an
execution plan per shape and caches it per thread. This script calls it the way a step does (one call per
layer, `--layers` calls in a row) for a sequence of chunk shapes, some repeated, and times each call's
host time (from the call to its return, the GPU idle before it) and its GPU time (CUDA events). A shape
met before should cost only its launch; the first call of a new one shows the plan build.

    python bench/prefill_shape_cost.py --shapes 8192x8192,7000x8192,8192x8192,3000x3000 --layers 3 --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from k2bench.engine.kernels.triton_backend import prefill_attention


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8192x8192,7000x8192,8192x8192,5000x5000,4990x4990,5000x5000",
                    help="chunk rows x context length, comma separated, in call order")
    ap.add_argument("--layers", type=int, default=3, help="calls per shape, as one step makes one per layer")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    H, nope, rope, r, v = args.heads, 128, 64, 512, 128
    g = torch.Generator().manual_seed(0)
    w_uk = (torch.randn(H, nope, r, generator=g) / r**0.5).to("cuda", torch.bfloat16)
    w_uv = (torch.randn(H, v, r, generator=g) / r**0.5).to("cuda", torch.bfloat16)
    rows = []
    for shape in args.shapes.split(","):
        n, ctx = (int(x) for x in shape.split("x"))
        kv = torch.randn(ctx, r + rope, device="cuda", dtype=torch.bfloat16)
        q_nope = torch.randn(n, H, nope, device="cuda", dtype=torch.bfloat16)
        q_pe = torch.randn(n, H, rope, device="cuda", dtype=torch.bfloat16)
        for layer in range(args.layers):
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            a.record()
            prefill_attention(q_nope, q_pe, kv, (nope + rope) ** -0.5, w_uk, w_uv)
            b.record()
            host = (time.perf_counter() - t0) * 1e3
            b.synchronize()
            row = {"n": n, "ctx": ctx, "call": layer, "host_ms": round(host, 3), "gpu_ms": round(a.elapsed_time(b), 3)}
            rows.append(row)
            print(f"{n:>6} x {ctx:<6} call {layer}: host {host:8.2f} ms  gpu {row['gpu_ms']:8.2f} ms", flush=True)
    (args.out / "prefill_shape_cost.json").write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                                  "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
