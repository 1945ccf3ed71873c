"""Tile configurations of the triton backend's kernels at Kimi-K2.5 width, timed alone on one GPU.

- fused MXFP4 MoE on the checkpoint layout (`triton_moe.fused_moe_mxfp4`, `tl.dot_scaled`; the fast
  layout's tiles are swept by bench/engine_moe_gpu_bench.py): E=384 experts of H=7168 x L (2048/tp),
  top 8, A4W4 numerics, for decode-sized and prefill-sized token counts; split-K (K slices of both
  GEMMs: 1 = the whole-K kernels, None = the automatic choice). A tile field left None takes
  `moe_dispatch.scaled_tiles`'s value (num_stages None: the dispatched stages, which may be Triton's
  default)
- paged MLA decode (`triton_attention.mla_decode`): r=512, rope 64, block 16, 8k contexts, the
  per-rank head counts of TP 2 and 4
- dense MXFP4 GEMM in A4W4: FP4 x FP4 through `dot_scaled`, against quantise-dequantise of the
  activations to bf16 and the bf16 x FP4 form (the same exact products), the latter at several
  split-K counts for decode-sized M

Each row: median of CUDA-event timings and the bytes the call must read over the measured copy
bandwidth (x floor). The events bracket an eager call, so at decode sizes, where the host launches
kernels slower than the GPU runs them, they include launch gaps (a CUDA-graph replay does not):
`--moe-k` adds a kernel-level profile. Prints a table per kernel and writes kernel_tune.json.

    python bench/engine_kernel_tune.py --tp 2 --out /tmp/out
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from k2bench.engine.kernels.triton_attention import mla_decode
from k2bench.engine.kernels.triton_backend import gemm_split_k, mxfp4_matmul
from k2bench.engine.kernels.triton_moe import fused_moe_mxfp4
from k2bench.engine.model.mxfp4 import fake_quantize_mxfp4

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_gpu_bench import copy_bandwidth_gbs, cuda_time_ms  # noqa: E402

E, H, TOPK, R, P, PAGE = 384, 7168, 8, 512, 64, 16
MOE_CONFIGS = [  # (block_n, num_warps, num_stages, split_k): split 1 = whole K, None = auto
    (64, 4, None, 1), (128, 4, 3, 1), (128, 8, 3, 1), (64, 8, 4, 1), (32, 4, 4, 1),
    (64, 4, None, None), (64, 4, None, 2), (64, 4, None, 4), (64, 4, None, 8), (64, 4, None, 14),
    (128, 4, 3, 4), (32, 4, 4, 4),
]
# (block_n, num_warps, num_stages, block_k): longer K tiles and deeper pipelines keep more weight bytes
# in flight per program, which is what a few-token (latency-bound) MoE lacks
MOE_K_CONFIGS = [
    (64, 4, 3, 256), (64, 4, 4, 256), (64, 8, 4, 256), (64, 4, 3, 512), (128, 8, 3, 256), (32, 4, 5, 256),
]
GEMM_SPLITS = (1, 2, 4, 8, 16, None)  # for M <= 128 only
ATTN_CONFIGS = [  # (block_h, block_n, num_warps, num_stages or None for Triton's default)
    (16, 32, 4, None), (16, 64, 4, None), (16, 16, 4, None), (32, 32, 8, None), (32, 16, 4, None),
    (64, 16, 8, None), (32, 64, 8, None),
    # all 64 heads of a sequence in one program (the latent tile read once), deeper pipelines
    (64, 32, 8, None), (64, 64, 8, None), (64, 32, 8, 2), (64, 32, 4, 2), (32, 64, 8, 2), (32, 64, 8, 4),
    (16, 64, 4, 3), (16, 32, 4, 4),
]


def random_mxfp4(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed E2M1 bytes and E8M0 scales near 2^-7 (weights of a few hundredths)."""
    w = torch.randint(0, 256, (*shape[:-1], shape[-1] // 2), dtype=torch.uint8, device="cuda")
    s = torch.randint(118, 122, (*shape[:-1], shape[-1] // 32), dtype=torch.uint8, device="cuda")
    return w, s


def tune_moe(tp: int, bw: float, tokens: list[int], reps: int, k_configs: bool = False) -> list[dict]:
    L = 2048 // tp
    w13, s13 = random_mxfp4(E, 2 * L, H)
    w2, s2 = random_mxfp4(E, H, L)
    expert_bytes = (w13[0].numel() + s13[0].numel() + w2[0].numel() + s2[0].numel())
    rows = []
    for T in tokens:
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(T, E, device="cuda")
        wts, ids = logits.softmax(-1).topk(TOPK, dim=-1)
        touched = int(torch.unique(ids).numel())
        floor_ms = touched * expert_bytes / (bw * 1e9) * 1e3
        ref = None
        configs = [(*c, None) for c in MOE_CONFIGS] if not k_configs else \
            [(bn, w, st, 1, bk) for bn, w, st, bk in MOE_K_CONFIGS]
        for bn, warps, stages, split, bk in configs:
            kw = dict(a4w4=True, block_n=bn, num_warps=warps, num_stages=stages, split_k=split, block_k=bk)
            cfg = [bn, warps, stages, split, bk]
            try:
                out = fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2, **kw)
                med, _ = cuda_time_ms(lambda kw=kw, x=x, ids=ids, wts=wts: fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2, **kw), reps)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a result
                rows.append({"kernel": "moe", "tp": tp, "T": T, "config": cfg, "error": str(exc)[:200]})
                print(f"moe T={T:>5} bn={bn:<3} w={warps} s={stages} split={split} bk={bk}: FAILED {str(exc)[:80]}",
                      flush=True)
                continue
            ref = out.float() if ref is None else ref
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            rows.append({"kernel": "moe", "tp": tp, "T": T, "config": cfg, "ms": med,
                         "floor_ms": floor_ms, "x_floor": med / floor_ms, "experts_touched": touched, "diff_vs_first": err})
            print(f"moe T={T:>5} bn={bn:<3} w={warps} s={stages} split={split} bk={bk}: {med:8.3f} ms  floor {floor_ms:6.3f}  "
                  f"x{med / floor_ms:5.1f}  diff {err:.1e}", flush=True)
    return rows


# (block_m, block_n, num_warps, num_stages, block_k) for prefill-sized token counts
MOE_PREFILL_CONFIGS = [
    (64, 64, 4, None, 128), (128, 64, 4, 3, 128), (128, 128, 8, 3, 128), (64, 128, 4, 3, 128), (128, 128, 8, 3, 64),
    (128, 256, 8, 3, 64),
]


def tune_moe_prefill(tp: int, T: int, reps: int) -> list[dict]:
    """Tiles of the fused MoE at a prefill chunk's token count, against its FLOP floor (bf16 dense peak
    989 TFLOP/s on an H200 SXM): here the kernel is compute-bound, not memory-bound."""
    L = 2048 // tp
    w13, s13 = random_mxfp4(E, 2 * L, H)
    w2, s2 = random_mxfp4(E, H, L)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    wts, ids = torch.randn(T, E, device="cuda").softmax(-1).topk(TOPK, dim=-1)
    flops = T * TOPK * 3 * L * H * 2
    rows, ref = [], None
    for bm, bn, warps, stages, bk in MOE_PREFILL_CONFIGS:
        kw = dict(a4w4=True, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages, block_k=bk)
        try:
            out = fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2, **kw).float()
            med, _ = cuda_time_ms(lambda kw=kw: fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2, **kw), reps)
        except Exception as exc:  # noqa: BLE001
            rows.append({"kernel": "moe_prefill", "T": T, "config": list(kw.values())[1:], "error": str(exc)[:200]})
            print(f"moe T={T} bm={bm} bn={bn} w={warps} s={stages} bk={bk}: FAILED {str(exc)[:80]}", flush=True)
            continue
        ref = out if ref is None else ref
        err = float((out - ref).abs().max() / ref.abs().max())
        tflops = flops / (med / 1e3) / 1e12
        rows.append({"kernel": "moe_prefill", "T": T, "config": [bm, bn, warps, stages, bk], "ms": med,
                     "tflops": tflops, "diff_vs_first": err})
        print(f"moe T={T} bm={bm:<3} bn={bn:<3} w={warps} s={stages} bk={bk:<3}: {med:8.2f} ms  "
              f"{tflops:6.1f} TFLOP/s  diff {err:.1e}", flush=True)
    return rows


def profile_moe(tp: int, T: int, out: Path) -> None:
    """Kernel-level CUDA times of one default fused-MoE call (what the launch overhead hides)."""
    from torch.profiler import ProfilerActivity, profile

    L = 2048 // tp
    w13, s13 = random_mxfp4(E, 2 * L, H)
    w2, s2 = random_mxfp4(E, H, L)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    wts, ids = torch.randn(T, E, device="cuda").softmax(-1).topk(TOPK, dim=-1)
    for _ in range(3):
        fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2, a4w4=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2, a4w4=True)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    (out / f"profile_moe_T{T}.txt").write_text(table)
    print(table, flush=True)


def tune_attention(heads: int, bw: float, batches: list[int], ctx: int, reps: int) -> list[dict]:
    rows = []
    per_seq = ctx // PAGE
    num_blocks = max(batches) * per_seq + 1
    cache = torch.randn(num_blocks, PAGE, R + P, device="cuda", dtype=torch.bfloat16)
    for B in batches:
        tables = torch.randperm(num_blocks - 1, device="cuda")[: B * per_seq].view(B, per_seq) + 1
        lens = torch.full((B,), ctx, device="cuda", dtype=torch.int64)
        q_lat = torch.randn(B, heads, R, device="cuda", dtype=torch.bfloat16)
        q_pe = torch.randn(B, heads, P, device="cuda", dtype=torch.bfloat16)
        floor_ms = B * ctx * (R + P) * 2 / (bw * 1e9) * 1e3
        ref = None
        for bh, bn, warps, stages in ATTN_CONFIGS:
            if bh > heads:
                continue
            kw = dict(block_h=bh, block_n=bn, num_warps=warps, num_stages=stages)
            try:
                out = mla_decode(q_lat, q_pe, cache, tables, lens, 0.07, **kw)
                med, _ = cuda_time_ms(lambda kw=kw, a=q_lat, b=q_pe, t=tables, n=lens: mla_decode(a, b, cache, t, n, 0.07, **kw), reps)
            except Exception as exc:  # noqa: BLE001
                rows.append({"kernel": "mla_decode", "heads": heads, "B": B, "config": [bh, bn, warps, stages], "error": str(exc)[:200]})
                print(f"mla H={heads} B={B:>4} bh={bh} bn={bn} w={warps}: FAILED {str(exc)[:80]}", flush=True)
                continue
            ref = out.float() if ref is None else ref
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            rows.append({"kernel": "mla_decode", "heads": heads, "B": B, "ctx": ctx, "config": [bh, bn, warps, stages], "ms": med,
                         "floor_ms": floor_ms, "x_floor": med / floor_ms, "diff_vs_first": err})
            print(f"mla H={heads} B={B:>4} bh={bh:<2} bn={bn:<2} w={warps} st={stages}: {med:8.3f} ms  floor {floor_ms:6.3f}  "
                  f"x{med / floor_ms:5.1f}  diff {err:.1e}", flush=True)
    return rows


def tune_gemm(bw: float, shapes: list[tuple[int, int, int]], reps: int) -> list[dict]:
    rows = []
    for m, n, k in shapes:
        w, s = random_mxfp4(n, k)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        floor_ms = (w.numel() + s.numel()) / (bw * 1e9) * 1e3
        forms = {
            "fp4 x fp4 (dot_scaled)": lambda x=x, w=w, s=s: mxfp4_matmul(x, w, s, a4w4=True),
            "fake-quant bf16 x fp4": lambda x=x, w=w, s=s: mxfp4_matmul(fake_quantize_mxfp4(x).to(torch.bfloat16), w, s, a4w4=False),
        }
        if m <= 128:  # split-K of the bf16 x FP4 form (what A4W4 runs on an H200); 1 = whole K
            xq = fake_quantize_mxfp4(x).to(torch.bfloat16)
            for sk in GEMM_SPLITS:
                forms[f"bf16 x fp4 split {sk or f'auto={gemm_split_k(m, n, k)}'}"] = (
                    lambda xq=xq, w=w, s=s, sk=sk: mxfp4_matmul(xq, w, s, a4w4=False, split_k=sk))
        ref = None
        for name, fn in forms.items():
            out = fn().float()
            ref = out if ref is None else ref
            med, _ = cuda_time_ms(fn, reps)
            err = float((out - ref).abs().max() / ref.abs().max())
            rows.append({"kernel": "gemm", "shape": [m, n, k], "form": name, "ms": med, "floor_ms": floor_ms,
                         "x_floor": med / floor_ms, "diff_vs_first": err})
            print(f"gemm {m}x{n}x{k} {name:<24}: {med:8.3f} ms  floor {floor_ms:6.3f}  x{med / floor_ms:5.1f}  diff {err:.1e}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--moe-tokens", default="4,32,128,8192")
    ap.add_argument("--batches", default="4,32,128")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--moe-prefill", type=int, default=0, help="only the MoE tiles at this many tokens")
    ap.add_argument("--moe-k", action="store_true", help="only the MoE's K-tile sweep plus a kernel profile")
    ap.add_argument("--no-gemm", dest="gemm", action="store_false", help="skip the dense GEMM forms")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    tokens = [int(t) for t in args.moe_tokens.split(",")]
    if args.moe_prefill:
        rows = tune_moe_prefill(args.tp, args.moe_prefill, args.reps)
        (args.out / "kernel_tune_moe_prefill.json").write_text(json.dumps({"tp": args.tp, "rows": rows}, indent=1))
        return 0
    if args.moe_k:  # only the K-tile sweep of the MoE, and where its time goes
        rows = tune_moe(args.tp, bw, tokens, args.reps, k_configs=True)
        profile_moe(args.tp, tokens[0], args.out)
        (args.out / "kernel_tune_moe_k.json").write_text(json.dumps({"bandwidth_gbs": bw, "tp": args.tp, "rows": rows}, indent=1))
        return 0
    rows = tune_moe(args.tp, bw, tokens, args.reps)
    batches = [int(b) for b in args.batches.split(",")]
    for heads in sorted({64 // args.tp, 16}, reverse=True):
        rows += tune_attention(heads, bw, batches, args.ctx, args.reps)
    inter = 18432 // args.tp
    if args.gemm:
        rows += tune_gemm(bw, [(4, 2 * inter, H), (128, 2 * inter, H), (4, H, inter), (8192, 2 * inter, H)], args.reps)
    doc = {"bandwidth_gbs": bw, "tp": args.tp, "device": torch.cuda.get_device_name(), "rows": rows}
    (args.out / "kernel_tune.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
