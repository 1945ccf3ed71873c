"""The routed-expert MoE kernels alone on one GPU at Kimi-K2.5 width, against their byte floor.

E=384 experts, H=7168, L=2048/tp, top 8, A4W4 numerics (the bench checkpoint's), random MXFP4
weights with scales near 2^-7. For each token count: both kernel families of `moe_dispatch`, the
checkpoint-layout kernel (`triton_moe.fused_moe_mxfp4`, `tl.dot_scaled`) and the fast layout
(`triton_moe_fast.fused_moe_fast`), each at its dispatched tiles, and the fast one at a few others. Each call is
captured in a CUDA graph and replayed (so decode sizes are not timed as host launch gaps); median of
CUDA-event timings. Floor: the touched experts' bytes (weights + scales) over the measured copy
bandwidth; at prefill sizes the kernel is compute-bound, so TFLOP/s is printed too. `--profile`
adds the per-kernel GPU times of each fast config (torch.profiler, eager).

    python bench/engine_moe_gpu_bench.py --tokens 4,32,128,8192 --out /tmp/out
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch

from k2bench.engine.kernels.moe_dispatch import FAST_PREFILL_PAIRS, FastTiles, fast_tiles, scaled_tiles
from k2bench.engine.kernels.moe_fast_layout import relayout_experts
from k2bench.engine.kernels.triton_moe import fused_moe_mxfp4
from k2bench.engine.kernels.triton_moe_fast import fused_moe_fast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_gpu_bench import copy_bandwidth_gbs, cuda_time_ms  # noqa: E402

E, H, TOPK = 384, 7168, 8
# (block_m, block_n, num_warps, num_stages, prefetch, chunks per K step of gate/up, of down, split_k): the
# dispatched rows' neighbours (moe_dispatch.FAST_TILES says what they measured). 256 weight rows per program
# on pointer loads once stopped an H200 run with a misaligned-address fault; on descriptors they measured
# slower than 128 (bench/results/2026-12-01_h200_moe4).
DECODE_SWEEP = [
    (16, 128, 4, 4, True, 1, 1, 1), (16, 128, 4, 3, True, 1, 1, 1), (16, 128, 4, 3, True, 2, 2, 1),
    (16, 128, 4, 4, True, 1, 2, 1), (16, 128, 4, 3, True, 1, 2, 2), (16, 256, 4, 3, True, 1, 2, 1),
    (32, 128, 4, 3, True, 1, 2, 1), (32, 128, 4, 4, True, 1, 2, 1), (16, 128, 4, 3, False, 1, 2, 1),
]
PREFILL_SWEEP = [(64, 128, 8, 4, False, 1, 1, 1), (64, 128, 8, 3, False, 1, 2, 1), (64, 128, 8, 4, False, 2, 2, 1)]

def random_mxfp4(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randint(0, 256, (*shape[:-1], shape[-1] // 2), dtype=torch.uint8, device="cuda")
    s = torch.randint(118, 122, (*shape[:-1], shape[-1] // 32), dtype=torch.uint8, device="cuda")
    return w, s


def describe(cfg) -> str:
    if not isinstance(cfg, FastTiles):
        return f"{cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"
    c13, c2 = cfg.step_chunks()
    pf = " pf" if cfg.prefetch else " nopf"
    return f"{cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}{pf} c{c13}/{c2}"


def graph_time_ms(fn, reps: int) -> float:
    """Median replay time of `fn` captured in a CUDA graph (after an eager warm-up that compiles)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    med, _ = cuda_time_ms(graph.replay, reps)
    return med


def kernel_profile(fn, calls: int = 5) -> dict[str, float]:
    """GPU ms per call of each kernel fn launches (eager)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if us:
            out[ev.key[:60]] = us / 1e3 / calls
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:8])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="4,32,128,8192")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-sweep", dest="sweep", action="store_false", help="only the baseline and the dispatched tiles")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    L = 2048 // args.tp
    bw = copy_bandwidth_gbs()
    w13, s13 = random_mxfp4(E, 2 * L, H)
    w2, s2 = random_mxfp4(E, H, L)
    fast = relayout_experts(w13, s13, w2, s2)
    expert_bytes = w13[0].numel() + s13[0].numel() + w2[0].numel() + s2[0].numel()
    print(f"copy bandwidth {bw:.0f} GB/s; E={E} H={H} L={L} top {TOPK}, A4W4", flush=True)
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for T in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen)
        wts, ids = torch.randn(T, E, device="cuda", generator=gen).softmax(-1).topk(TOPK, dim=-1)
        touched = int(torch.unique(ids).numel())
        floor_ms = touched * expert_bytes / (bw * 1e9) * 1e3
        flops = T * TOPK * 3 * L * H * 2
        ref = fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2, a4w4=True).float()
        sweep = (PREFILL_SWEEP if T * TOPK >= FAST_PREFILL_PAIRS * E else DECODE_SWEEP) if args.sweep else []
        runs = [("dot_scaled", None, 1), ("fast", None, 1)]
        runs += [("fast", FastTiles(*c[:7]), c[7]) for c in sweep]
        for name, cfg, split in runs:
            if name == "dot_scaled":
                fn = partial(fused_moe_mxfp4, x, ids, wts, w13, s13, w2, s2, a4w4=True)
                label = f"dot_scaled (dispatch {describe(scaled_tiles(T * TOPK, E))})"
            else:
                fn = partial(fused_moe_fast, x, ids, wts, fast, a4w4=True, config=cfg, split_k=split)
                label = f"fast (dispatch {describe(fast_tiles(T * TOPK, E))})" if cfg is None else \
                    f"fast {describe(cfg)} split{split}"
            try:
                err = float((fn().float() - ref).abs().max() / ref.abs().max())
                ms = graph_time_ms(fn, args.reps)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a result
                rows.append({"T": T, "config": label, "error": str(exc)[:300]})
                print(f"T={T:>5} {label:<56} FAILED {str(exc)[:100]}", flush=True)
                continue
            row = {"T": T, "config": label, "ms": ms, "floor_ms": floor_ms, "x_floor": ms / floor_ms,
                   "tflops": flops / ms / 1e9, "experts_touched": touched, "rel_diff_vs_dot_scaled": err}
            if args.profile and name != "dot_scaled":  # eager per-kernel times: gate/up and down apart
                row["kernels_ms"] = kernel_profile(fn)
            rows.append(row)
            print(f"T={T:>5} {label:<56} {ms:8.3f} ms  floor {floor_ms:6.3f}  x{ms / floor_ms:5.2f}  "
                  f"{row['tflops']:6.1f} TFLOP/s  diff {err:.1e}", flush=True)
            if "kernels_ms" in row:
                print("        " + ", ".join(f"{k[:24]} {v:.3f}" for k, v in list(row["kernels_ms"].items())[:3]),
                      flush=True)
    (args.out / "moe_gpu_bench.json").write_text(json.dumps({"bandwidth_gbs": bw, "E": E, "H": H, "L": L,
                                                            "topk": TOPK, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
