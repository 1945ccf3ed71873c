"""Routed-expert MoE of the torch backend on CPU: the batched per-pair path against the per-expert loop.

For a few (experts, hidden, intermediate, top-k) shapes and token counts with tokens x k <= experts
(where fused_moe may take the batched path), times both paths on the same inputs (MXFP4 weights,
bf16 activations, A4W4 and W4), plus MXFP4 dequantisation: the single-gather table against the
two-step decode (byte-table gather, then times the block scale, then cast) it replaced.
Times are min and median of --reps calls; on a shared machine read the min and the ratio.

    python bench/engine_moe_bench.py [--reps 200] [--threads 1] [--out bench/results/engine_moe_bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

from k2bench.engine.kernels.torch_backend import CPU_PAIR_BUDGET, ExpertStack, TorchBackend
from k2bench.engine.model.mxfp4 import (
    BLOCK,
    _byte_lut,
    dequantize_mxfp4,
    e8m0_to_float,
    fake_quantize_mxfp4,
    quantize_mxfp4,
)

SHAPES = [(16, 128, 128, 4), (64, 1024, 256, 8)]  # the tiny checkpoint; a K2.5-like ratio, scaled down


def timed(fn, reps: int) -> tuple[float, float]:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts) * 1e3, statistics.median(ts) * 1e3


def two_step_dequant(p: torch.Tensor, sc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    k = p.shape[-1] * 2
    vals = _byte_lut(p.device, torch.float32)[p.long()].reshape(*p.shape[:-1], k // BLOCK, BLOCK)
    return (vals * e8m0_to_float(sc).unsqueeze(-1)).reshape(*p.shape[:-1], k).to(dtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/results/engine_moe_bench.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    be = TorchBackend()
    g = torch.Generator().manual_seed(0)
    rows = []
    print(f"threads {args.threads}, load average {load:.1f} at start, {args.reps} reps\n")
    print(f"{'E':>4} {'H':>5} {'I':>4} {'k':>2} {'T':>3} {'mode':>5} {'loop min/med ms':>16} "
          f"{'batched min/med ms':>19} {'speed-up (min)':>14} {'fused_moe on CPU':>16}")
    for E, H, inter, k in SHAPES:
        w13, s13 = quantize_mxfp4(torch.randn(E, 2 * inter, H, generator=g) * 0.05)
        w2, s2 = quantize_mxfp4(torch.randn(E, H, inter, generator=g) * 0.05)
        experts = ExpertStack(w13, s13, w2, s2)
        for T in sorted({1, max(1, E // k // 4), E // k}):
            x = torch.randn(T, H, generator=g).bfloat16()
            ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
            wts = torch.rand(T, k, generator=g)
            for a4w4 in (True, False):
                xq = fake_quantize_mxfp4(x) if a4w4 else x
                loop = timed(partial(be._moe_expert_loop, xq, ids, wts, experts, a4w4=a4w4), args.reps)
                pair = timed(partial(be._moe_per_assignment, xq, ids, wts, experts, a4w4=a4w4), args.reps)
                mode = "a4w4" if a4w4 else "w4"
                picks = "batched" if T * k * w13[0].numel() <= CPU_PAIR_BUDGET else "loop"
                rows.append({"experts": E, "hidden": H, "inter": inter, "k": k, "tokens": T, "mode": mode,
                             "loop_ms": loop, "batched_ms": pair, "speedup_min": round(loop[0] / pair[0], 2), "cpu_picks": picks})
                print(f"{E:>4} {H:>5} {inter:>4} {k:>2} {T:>3} {mode:>5} {loop[0]:>7.2f}/{loop[1]:<8.2f} "
                      f"{pair[0]:>9.2f}/{pair[1]:<9.2f} {loop[0] / pair[0]:>13.2f}x {picks:>16}")
    deq = []
    print(f"\n{'packed shape':>16} {'two-step min ms':>16} {'one gather min ms':>18}")
    for shape in ((192, 64), (256, 64), (16, 256, 64), (2048, 512)):
        p, sc = quantize_mxfp4(torch.randn(*shape[:-1], shape[-1] * 2, generator=g))
        old = timed(partial(two_step_dequant, p, sc, torch.bfloat16), args.reps)
        new = timed(partial(dequantize_mxfp4, p, sc, torch.bfloat16), args.reps)
        deq.append({"packed_shape": list(shape), "two_step_ms": old, "one_gather_ms": new})
        print(f"{str(shape):>16} {old[0]:>16.3f} {new[0]:>18.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"load_average": load, "threads": args.threads, "reps": args.reps,
                                          "moe": rows, "dequant": deq}, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
