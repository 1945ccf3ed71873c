"""MLA decode attention alone on one GPU against its byte floor (the latent cache read once per step).

Kimi-K2.5 width at TP 1: 64 heads, latent 512 + rope 64 per cached token in bf16, pages of 16 tokens
handed out shuffled. The floor is B x ctx x 576 x 2 bytes over the measured copy bandwidth (queries and
outputs are a few MB and left out). Prints the default launch (the Gluon kernel on sm_90) and the `tl`
kernel's, and with --sweep the Gluon kernel with and without its L2 prefetch over split counts near the
default (the 2026-12-01 mla4 run also swept the loop options that are now its fixed design); --sweep
full adds its 32-token tiles, the `tl` kernel's pipeline stages and every split count up to four rounds
of programs. Each row's output is compared with the default's so a fast wrong configuration shows. More
rows per batch read the limits: the default and the fastest configuration on an L2-resident cache (each
table repeats one tile's blocks, so the time is the kernel's own work, not HBM's), and the merge kernel
alone where the default splits. Medians of CUDA-event timings of `--inner` calls replayed from one CUDA
graph (divided), as the engine runs decode, so the host's launch time (tens of microseconds of Python
per call, which made batch 4 host-bound in the 2026-12-01 runs) is not counted; --no-graph times plain
back-to-back calls. Writes JSON.

    python bench/engine_mla_bench.py --batches 4,32,128 --ctx 8192 [--sweep [full]] --out /tmp/out
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_gpu_bench import copy_bandwidth_gbs, cuda_time_ms  # noqa: E402

from k2bench.engine.kernels.triton_attention import default_num_splits, merge_splits, mla_decode  # noqa: E402

PAGE, HEADS, R, P = 16, 64, 512, 64


def inputs(batch: int, ctx: int, gen: torch.Generator):
    per_seq = -(-ctx // PAGE)
    blocks = torch.randperm(batch * per_seq + 1, generator=gen)[: batch * per_seq].view(batch, per_seq)
    cache = torch.randn(batch * per_seq + 1, PAGE, R + P, device="cuda").to(torch.bfloat16)
    q_lat = torch.randn(batch, HEADS, R, device="cuda").to(torch.bfloat16)
    q_pe = torch.randn(batch, HEADS, P, device="cuda").to(torch.bfloat16)
    lens = torch.full((batch,), ctx, dtype=torch.int64, device="cuda")
    return q_lat, q_pe, cache, blocks.cuda(), lens


def timed(fn, reps: int, inner: int, graph: bool) -> float:
    """Median ms of one call: `inner` calls per timed interval, replayed from a CUDA graph when asked."""
    if not graph:
        med, _ = cuda_time_ms(lambda: [fn() for _ in range(inner)], reps)
        return med / inner
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and allocate outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    med, _ = cuda_time_ms(g.replay, reps)
    return med / inner


def sweep_configs(kind: str, batch: int, dflt: int, sms: int) -> list[tuple[str, dict]]:
    """The Gluon kernel's options over splits near the default (kind "near"), or a wider grid ("full")."""
    splits = sorted({max(1, dflt // 4), max(1, dflt // 2), dflt, min(32, 2 * dflt)})  # fewer splits, smaller merge
    if kind == "full":
        splits = sorted({s for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if batch * s <= 4 * sms} | {dflt})
    tiles = ((64, 2), (32, 4)) if kind == "full" else ((64, 2),)
    configs = [("sweep", dict(variant="hopper", block_n=bn, nbuf=nb, prefetch=pf, num_splits=sp))
               for (bn, nb), pf, sp in itertools.product(tiles, (False, True), splits)]
    if kind == "full":  # the tl kernel's 3 stages beat its 2 on 2026-12-01 (bench/results/2026-12-01_h200_mla3)
        configs += [("sweep", dict(block_h=64, block_n=64, num_warps=8, num_stages=3, num_splits=sp)) for sp in splits]
    return configs


def limits(batch: int, args: argparse.Namespace, tensors: tuple, scale: float, best: dict, dflt: int,
           floor_ms: float) -> list[dict]:
    """Rows that say where the time goes: the default and the best configuration on an L2-resident cache
    (each sequence's table repeats its first four blocks, one 64-token tile: 72 KB a sequence, 9.4 MB at
    batch 128, read from L2 every tile, so what is left is the kernel's own work and latency), and the
    merge kernel alone at the default split count."""
    q_lat, q_pe, cache, tables, lens = tensors
    out = []
    l2_tables = tables[:, torch.arange(tables.shape[1], device=tables.device) % 4]
    for cfg in [{}] + ([best] if best else []):
        l2 = functools.partial(mla_decode, q_lat, q_pe, cache, l2_tables, lens, scale, **cfg)
        ms = timed(l2, args.reps, args.inner, args.graph)
        out.append({"batch": batch, "ctx": args.ctx, "label": "L2-resident cache", "config": cfg, "ms": ms,
                    "floor_ms": floor_ms, "x_floor": ms / floor_ms})
    if dflt > 1:
        part = torch.randn(batch, HEADS, dflt, R, device="cuda")
        lse = torch.randn(batch, HEADS, dflt, device="cuda")
        res = torch.empty(batch, HEADS, R, dtype=q_lat.dtype, device="cuda")
        ms = timed(functools.partial(merge_splits, part, lse, res), args.reps, args.inner, args.graph)
        out.append({"batch": batch, "ctx": args.ctx, "label": "merge alone", "config": {"num_splits": dflt}, "ms": ms,
                    "floor_ms": floor_ms, "x_floor": ms / floor_ms})
    for r in out:
        print(f"B={batch:>4} {r['label']:<20} {json.dumps(r['config']):<70} {r['ms']:7.3f} ms", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="4,32,128")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--sweep", nargs="?", const="near", choices=("near", "full"),
                    help="also time a grid of tiles and splits (near the default split count, or full)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--inner", type=int, default=10, help="calls per timed interval")
    ap.add_argument("--no-graph", dest="graph", action="store_false",
                    help="time plain back-to-back calls instead of a CUDA graph's replay")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth_gbs()
    gen = torch.Generator().manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print(f"copy bandwidth {bw:.0f} GB/s, {sms} SMs", flush=True)
    for batch in (int(b) for b in args.batches.split(",")):
        q_lat, q_pe, cache, tables, lens = inputs(batch, args.ctx, gen)
        floor_ms = batch * args.ctx * (R + P) * 2 / (bw * 1e9) * 1e3
        scale = 0.1
        tensors = (q_lat, q_pe, cache, tables, lens)
        ref = mla_decode(*tensors, scale)
        # (label, mla_decode keywords); the default is timed again last: a batch's first timing has read
        # up to 10% slow (2026-12-01, batch 32: 0.141 ms first, 0.128 for the same launch later)
        configs = [("default", {}), ("triton default", {"variant": "triton"})]
        dflt = default_num_splits(batch, HEADS, tables.shape[1], PAGE, num_sms=sms, block_h=64)
        if args.sweep:
            configs += sweep_configs(args.sweep, batch, dflt, sms)
        for label, cfg in configs + [("default, again", {})]:
            fn = functools.partial(mla_decode, *tensors, scale, **cfg)
            try:
                err = float((fn().float() - ref.float()).abs().max())
                med = timed(fn, args.reps, args.inner, args.graph)
            except Exception as exc:  # noqa: BLE001 - a configuration that does not fit is a result
                rows.append({"batch": batch, "label": label, "config": cfg,
                             "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            rows.append({"batch": batch, "ctx": args.ctx, "label": label, "config": cfg, "ms": med, "floor_ms": floor_ms,
                         "x_floor": med / floor_ms, "gbs": batch * args.ctx * (R + P) * 2 / med / 1e6,
                         "max_abs_diff_vs_default": err})
            name = label if label != "sweep" else " ".join(f"{k}={int(v) if isinstance(v, bool) else v}"
                                                           for k, v in cfg.items() if k != "variant")
            print(f"B={batch:>4} {name:<88} {med:7.3f} ms  floor {floor_ms:6.3f}  x{med / floor_ms:5.2f}  diff {err:.1e}",
                  flush=True)
        good = [r for r in rows if r.get("batch") == batch and r.get("max_abs_diff_vs_default", 1.0) < 0.05]
        best = min(good, key=lambda r: r["ms"]) if good else {"config": {}}
        if args.sweep and good:
            print(f"B={batch:>4} best {json.dumps(best['config'])} {best['ms']:.3f} ms x{best['x_floor']:.2f}", flush=True)
        rows += limits(batch, args, tensors, scale, best["config"], dflt, floor_ms)
        del q_lat, q_pe, cache, tensors, ref
        torch.cuda.empty_cache()
        doc = {"bandwidth_gbs": bw, "sms": sms, "inner": args.inner, "graph": args.graph,
               "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "triton": triton.__version__, "rows": rows}
        (args.out / "mla_bench.json").write_text(json.dumps(doc, indent=1))  # after every batch: a cut run keeps some
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
