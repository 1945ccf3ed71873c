"""Where the MLA decode kernel's time goes, by difference (no hardware counters needed).

A copy of `triton_attention._mla_decode_split`'s loop (64 heads of one sequence per program, 64-token
tiles over a paged bf16 cache, 8 warps, unsplit) with switches that leave one stage out:
- `full`: paged loads, scores (Q.K^T over 576 dims), online softmax, output (P.latent): the kernel;
- `no_pv`: the output product left out (its rescale too); loads, scores and softmax remain;
- `no_qk`: the score product left out (probabilities from the rope key's first column, so the
  tile is still consumed and the softmax still runs); loads, softmax and output remain;
- `compute`: the iterations read the sequence's first two tiles in turn (L2 / L1 hits, no DRAM traffic):
  products and softmax with on-chip loads.
Leaving a product out can change how triton lays out the other (a score product that feeds no second
product is not treated as chained), so the layouts each variant compiled to are printed with it.
Each variant is timed like bench/engine_mla_bench.py (CUDA events around back-to-back calls) and read
against the byte floor; the compiled kernel's registers, spills and shared memory are printed beside
it (from triton's cache), so the times can be read against what the compiler made.

    python bench/mla_decode_anatomy.py --batch 128 --ctx 8192 --out /tmp/out
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_gpu_bench import copy_bandwidth_gbs, cuda_time_ms  # noqa: E402
from engine_mla_bench import HEADS, PAGE, P, R, inputs  # noqa: E402

VARIANTS = {"full": (1, 1, 1), "no_pv": (1, 1, 0), "no_qk": (1, 0, 1), "compute": (0, 1, 1)}


@triton.jit
def _anatomy(q_lat_ptr, q_pe_ptr, kv_ptr, tables_ptr, lens_ptr, out_ptr, s_kvb, s_kvt, s_tb, qk_scale,
             R: tl.constexpr, P: tl.constexpr, PAGE: tl.constexpr, H: tl.constexpr, BLOCK_N: tl.constexpr,
             LOADS: tl.constexpr, QK: tl.constexpr, PV: tl.constexpr):
    b = tl.program_id(0)
    heads = tl.arange(0, H)
    rr = tl.arange(0, R)
    rp = tl.arange(0, P)
    rn = tl.arange(0, BLOCK_N)
    q_lat = tl.load(q_lat_ptr + b * H * R + heads[:, None] * R + rr[None, :])
    q_pe = tl.load(q_pe_ptr + b * H * P + heads[:, None] * P + rp[None, :])
    ctx = tl.load(lens_ptr + b).to(tl.int32)
    m_i = tl.full((H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((H,), dtype=tl.float32)
    acc = tl.zeros((H, R), dtype=tl.float32)
    for n0 in range(0, ctx, BLOCK_N):
        # without LOADS the iterations read the first two tiles in turn (cache hits, no DRAM traffic)
        tok = (n0 if LOADS else n0 % (2 * BLOCK_N)) + rn
        blk = tl.load(tables_ptr + b * s_tb + tok // PAGE)
        row = kv_ptr + blk.to(tl.int64) * s_kvb + (tok % PAGE) * s_kvt
        lat = tl.load(row[:, None] + rr[None, :])
        kpe = tl.load(row[:, None] + R + rp[None, :])
        if QK:
            s = tl.dot(q_lat, tl.trans(lat))
            s = tl.dot(q_pe, tl.trans(kpe), s) * qk_scale
        else:
            s = tl.broadcast_to(tl.sum(kpe.to(tl.float32), 1)[None, :], (H, BLOCK_N)) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if PV:
            acc = tl.dot(p.to(lat.dtype), lat, acc * alpha[:, None])
        else:
            acc += tl.sum(p, 1)[:, None]
        m_i = m_new
    tl.store(out_ptr + b * H * R + heads[:, None] * R + rr[None, :], (acc / l_i[:, None]).to(out_ptr.dtype.element_ty))


def run(variant: str, q_lat, q_pe, cache, tables, lens, *, block_n: int, stages: int) -> tuple[torch.Tensor, object]:
    loads, qk, pv = VARIANTS[variant]
    out = torch.empty_like(q_lat)
    kernel = _anatomy[(q_lat.shape[0],)](
        q_lat, q_pe, cache, tables, lens, out, cache.stride(0), cache.stride(1), tables.stride(0), 0.1,
        R=R, P=P, PAGE=PAGE, H=HEADS, BLOCK_N=block_n, LOADS=loads, QK=qk, PV=pv, num_warps=8, num_stages=stages)
    return out, kernel


def mma_layouts(kernel) -> list[str]:
    """The tensor-core layouts in the compiled TTGIR (warps per CTA and instruction shape of each)."""
    return sorted({m.group(1) for m in re.finditer(r"nvidia_mma<\{([^}]*)\}>", kernel.asm.get("ttgir", ""))})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth_gbs()
    gen = torch.Generator().manual_seed(0)
    q_lat, q_pe, cache, tables, lens = inputs(args.batch, args.ctx, gen)
    tables = tables.to(torch.int32)
    floor_ms = args.batch * args.ctx * (R + P) * 2 / (bw * 1e9) * 1e3
    rows = []
    for stages in (int(s) for s in args.stages.split(",")):
        for variant in VARIANTS:
            _, kernel = run(variant, q_lat, q_pe, cache, tables, lens, block_n=args.block_n, stages=stages)
            med, _ = cuda_time_ms(lambda v=variant, s=stages: [run(v, q_lat, q_pe, cache, tables, lens,
                                                                   block_n=args.block_n, stages=s)
                                                               for _ in range(args.inner)], args.reps)
            med /= args.inner
            row = {"variant": variant, "stages": stages, "block_n": args.block_n, "ms": med, "floor_ms": floor_ms,
                   "x_floor": med / floor_ms, "registers": kernel.n_regs, "spills": kernel.n_spills,
                   "shared_bytes": kernel.metadata.shared, "mma_layouts": mma_layouts(kernel)}
            rows.append(row)
            print(f"stages {stages} {variant:<8} {med:7.3f} ms  x{med / floor_ms:5.2f} floor {floor_ms:.3f}  regs "
                  f"{kernel.n_regs} spills {kernel.n_spills} smem {kernel.metadata.shared} {row['mma_layouts']}", flush=True)
    doc = {"batch": args.batch, "ctx": args.ctx, "bandwidth_gbs": bw, "device": torch.cuda.get_device_name(),
           "triton": triton.__version__, "rows": rows}
    (args.out / "mla_anatomy.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
