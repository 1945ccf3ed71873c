"""MLA decode attention alone on one GPU against its byte floor (the latent cache read once per step).

Kimi-K2.5 width at TP 1: 64 heads, latent 512 + rope 64 per cached token in bf16, pages of 16 tokens
handed out shuffled. The floor is B x ctx x 576 x 2 bytes over the measured copy bandwidth (queries and
outputs are a few MB and left out). Prints the default launch (the Gluon kernel on sm_90) and the `tl`
kernel's, and with --sweep a grid of splits for both: the Gluon kernel's tiles and shared buffers, the
`tl` kernel's pipeline stages; each row's output is compared with the default's so a fast wrong
configuration shows. Medians of CUDA-event timings around `--inner` back-to-back calls
(divided), so the host's launch time of one call (tens of microseconds of Python) is not counted as kernel
time; with --inner 1, as in the 2026-12-01 run, it is. Writes JSON.

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

from k2bench.engine.kernels.triton_attention import default_num_splits, mla_decode  # noqa: E402

PAGE, HEADS, R, P = 16, 64, 512, 64


def inputs(batch: int, ctx: int, gen: torch.Generator):
    per_seq = -(-ctx // PAGE)
    blocks = torch.randperm(batch * per_seq + 1, generator=gen)[: batch * per_seq].view(batch, per_seq)
    cache = torch.randn(batch * per_seq + 1, PAGE, R + P, device="cuda").to(torch.bfloat16)
    q_lat = torch.randn(batch, HEADS, R, device="cuda").to(torch.bfloat16)
    q_pe = torch.randn(batch, HEADS, P, device="cuda").to(torch.bfloat16)
    lens = torch.full((batch,), ctx, dtype=torch.int64, device="cuda")
    return q_lat, q_pe, cache, blocks.cuda(), lens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="4,32,128")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--sweep", nargs="?", const="near", choices=("near", "full"),
                    help="also time a grid of tiles and splits (near the default split count, or full)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--inner", type=int, default=10, help="calls per timed interval")
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
        if args.sweep:
            # split counts: half, once and twice the default (up to four rounds of programs with --sweep full)
            dflt = default_num_splits(batch, HEADS, tables.shape[1], PAGE, num_sms=sms, block_h=64)
            splits = sorted({max(1, dflt // 2), dflt, min(32, 2 * dflt)})
            if args.sweep == "full":
                splits = sorted({s for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if batch * s <= 4 * sms} | {dflt})
            # (tiles x buffers 32 x 2 and 32 x 3 trailed 32 x 4 at every batch on 2026-12-01, the tl kernel's
            # 2 stages its 3: bench/results/2026-12-01_h200_mla3/mla_sweep_midway.json)
            configs += [("sweep", dict(variant="hopper", block_n=bn, nbuf=nb, prefetch=pf, num_splits=sp))
                        for (bn, nb), pf, sp in itertools.product(((64, 2), (32, 4)), (True, False), splits)]
            configs += [("sweep", dict(block_h=64, block_n=64, num_warps=8, num_stages=3, num_splits=sp))
                        for sp in splits]
        for label, cfg in configs + [("default, again", {})]:
            fn = functools.partial(mla_decode, *tensors, scale, **cfg)
            try:
                err = float((fn().float() - ref.float()).abs().max())
                med, _ = cuda_time_ms(lambda f=fn: [f() for _ in range(args.inner)], args.reps)
                med /= args.inner
            except Exception as exc:  # noqa: BLE001 - a configuration that does not fit is a result
                rows.append({"batch": batch, "label": label, "config": cfg,
                             "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            rows.append({"batch": batch, "ctx": args.ctx, "label": label, "config": cfg, "ms": med, "floor_ms": floor_ms,
                         "x_floor": med / floor_ms, "gbs": batch * args.ctx * (R + P) * 2 / med / 1e6,
                         "max_abs_diff_vs_default": err})
            if label != "sweep" or med / floor_ms < 2.0:
                print(f"B={batch:>4} {label if label != 'sweep' else json.dumps(cfg):<90} {med:7.3f} ms  floor {floor_ms:6.3f}"
                      f"  x{med / floor_ms:5.2f}  diff {err:.1e}", flush=True)
        good = [r for r in rows if r.get("batch") == batch and "ms" in r and r["max_abs_diff_vs_default"] < 0.05]
        if args.sweep and good:
            best = min(good, key=lambda r: r["ms"])
            print(f"B={batch:>4} best {json.dumps(best['config'])} {best['ms']:.3f} ms x{best['x_floor']:.2f}", flush=True)
        del q_lat, q_pe, cache, tensors, ref
        torch.cuda.empty_cache()
        doc = {"bandwidth_gbs": bw, "sms": sms, "inner": args.inner, "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "triton": triton.__version__, "rows": rows}
        (args.out / "mla_bench.json").write_text(json.dumps(doc, indent=1))  # after every batch: a cut run keeps some
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
