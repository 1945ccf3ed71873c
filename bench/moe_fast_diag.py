"""Where the fast MoE GEMMs lose time against their byte floor: their loop body taken apart, one H200.

One diagnostic kernel runs the gate/up GEMM (two weight streams, K=7168) or the down GEMM (one stream,
K=2048) of `triton_moe_fast` at T tokens (E=384, top 8, blocks of 16 pairs, 128 weight rows per program),
with parts of its per-chunk work swapped out (MODE):
  0  today's body: activations by pointer loads a chunk ahead in registers, words + scales by descriptors
  1  activations through a tensor descriptor from a slot-ordered copy (output checked equal to mode 0)
  2  activations loaded once before the loop (no per-chunk activation load)
  3  words and scales by descriptors only, xor-reduced (no decode, no MMA)
  4  words only, xor-reduced
  5  as 3 at addresses where a program's chunks follow one another (a tile-major layout)
  6  as 5 with two chunks per copy
  7  as 0 without the per-chunk scale loads (the first chunk's scales reused: wrong values, same work)
  8  as 7 with the activations loaded once
Modes 2 and 4-8 compute wrong values on purpose: they bound what removing that part could give. Floor:
the touched experts' bytes of that GEMM's weights and scales over the measured copy bandwidth. Prints a
table (with each compiled kernel's registers and shared memory) and writes moe_diag.json.

    python bench/moe_fast_diag.py --tokens 4,32,128 --modes 0,2,7,8 --stages 3,4 --out /tmp/diag
    TRITON_INTERPRET=1 python bench/moe_fast_diag.py --tiny --tokens 5 --out /tmp/diag   # the CPU check
"""

# each launch closure is called inside the loop iteration that made it, so late binding cannot bite:
# ruff: noqa: B023

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_gpu_bench import copy_bandwidth_gbs, cuda_time_ms  # noqa: E402

from k2bench.engine.kernels.moe_fast_layout import relayout_experts
from k2bench.engine.kernels.triton_moe_fast import _load_x, _mma_chunk
from k2bench.engine.kernels.triton_moe_glue import block_pairs, moe_align


@triton.jit
def _next_x(x_ptrs, pair, num_pairs, kc, k_hi, K):
    kn = kc + 64
    x = _load_x(x_ptrs, pair < tl.where(kn < k_hi, num_pairs, 0), kn, K, 1)
    return x[0], x[1]


@triton.jit
def _load_w(w_desc, s_desc, row, BN: tl.constexpr):
    """A chunk's words [BN, 8] and scale codes [BN, 2] through 2-D views ([rows, 8] words, [rows / 8, 16]
    scales), which also reach the tile-major addresses of modes 5 and 6."""
    return w_desc.load([row, 0]), tl.reshape(s_desc.load([row // 8, 0]), (BN, 2))

@triton.jit
def _xor2(s):
    """A [n, 2] code pair folded to one int32 per row (the loads-only modes' use of the scales)."""
    lo, hi = tl.split(s)
    return (lo ^ hi).to(tl.int32)


E, H, TOPK = 384, 7168, 8
DEV = "cuda"


@triton.jit(do_not_specialize=["num_pairs"])
def _diag(x_ptr, xs_desc, w_desc, s_desc, w2d, s2d, out_ptr, pairs_ptr, block_experts_ptr,
          num_pairs, topk, N, K, s_xt, rows_e, rows_c, s_op,
          MODE: tl.constexpr, STREAMS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          INTERPRET: tl.constexpr, CH: tl.constexpr):
    expert = tl.load(block_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert < 0:
        return
    pair, valid, rn = block_pairs(pairs_ptr, num_pairs, BM, BN)
    tok = pair // topk
    x_ptrs = x_ptr + tok[None, :] * s_xt + tl.arange(0, 32)[:, None]
    acc_g = tl.zeros((BN, BM), dtype=tl.float32)
    acc_u = tl.zeros((BN, BM), dtype=tl.float32)
    acc_x = tl.zeros((BN, 8), dtype=tl.int32)
    row0 = (expert * rows_e).to(tl.int32) + tl.program_id(1) * BN
    slot0 = tl.program_id(0) * BM
    nx = _load_x(x_ptrs, valid, 0, K, 1)
    nxl, nxh = nx[0], nx[1]
    x0l, x0h = nxl, nxh
    _p0, s0 = _load_w(w_desc, s_desc, (expert * rows_e).to(tl.int32) + tl.program_id(1) * BN, BN)
    tile0 = (expert * rows_e).to(tl.int32) + tl.program_id(1) * BN * (K // 64)
    for kc in range(0, K, CH):
        if MODE == 0 or MODE == 7:
            xl, xh = nxl, nxh
            nxl, nxh = _next_x(x_ptrs, pair, num_pairs, kc, K, K)
        elif MODE == 1:
            xl = tl.trans(xs_desc.load([slot0, kc]))
            xh = tl.trans(xs_desc.load([slot0, kc + 32]))
        else:
            xl, xh = nxl, nxh
        if MODE == 8:
            xl, xh = x0l, x0h
        row = row0 + (kc // 64) * rows_c
        if MODE == 5:  # tile-major addresses: this program's chunks one after another
            r5 = tile0 + (kc // 64) * BN
            p5, s5 = _load_w(w_desc, s_desc, r5, BN)
            acc_x = acc_x ^ p5 ^ _xor2(s5)[:, None]
            if STREAMS == 2:
                p5, s5 = _load_w(w_desc, s_desc, r5 + N * (K // 64), BN)
                acc_x = acc_x ^ p5 ^ _xor2(s5)[:, None]
        elif MODE == 6:  # tile-major, two chunks per copy
            r6 = tile0 + (kc // 64) * BN
            p6, s6 = _load_w(w2d, s2d, r6, 2 * BN)
            acc_x = acc_x ^ tl.reshape(p6, (2, BN, 8)).sum(0) ^ tl.reshape(_xor2(s6), (2, BN)).sum(0)[:, None]
            if STREAMS == 2:
                p6, s6 = _load_w(w2d, s2d, r6 + N * (K // 64), 2 * BN)
                acc_x = acc_x ^ tl.reshape(p6, (2, BN, 8)).sum(0) ^ tl.reshape(_xor2(s6), (2, BN)).sum(0)[:, None]
        elif MODE >= 7:
            pg = w_desc.load([row, 0])
            acc_g = _mma_chunk(acc_g, pg, s0, xl, xh, INTERPRET, BN)
            if STREAMS == 2:
                pu = w_desc.load([row + N, 0])
                acc_u = _mma_chunk(acc_u, pu, s0, xl, xh, INTERPRET, BN)
        elif MODE == 4:
            acc_x = acc_x ^ w_desc.load([row, 0])
            if STREAMS == 2:
                acc_x = acc_x ^ w_desc.load([row + N, 0])
        else:
            pg, sg = _load_w(w_desc, s_desc, row, BN)
            if MODE == 3:
                acc_x = acc_x ^ pg ^ _xor2(sg)[:, None]
            else:
                acc_g = _mma_chunk(acc_g, pg, sg, xl, xh, INTERPRET, BN)
            if STREAMS == 2:
                pu, su = _load_w(w_desc, s_desc, row + N, BN)
                if MODE == 3:
                    acc_x = acc_x ^ pu ^ _xor2(su)[:, None]
                else:
                    acc_u = _mma_chunk(acc_u, pu, su, xl, xh, INTERPRET, BN)
    if MODE >= 3:
        acc_g += tl.sum(acc_x, axis=1).to(tl.float32)[:, None]
    res = acc_g * acc_u if STREAMS == 2 else acc_g
    tl.store(out_ptr + pair[None, :] * s_op + rn[:, None], res, mask=(rn < N)[:, None] & valid[None, :])


def random_mxfp4(*shape, gen):
    w = torch.randint(0, 256, (*shape[:-1], shape[-1] // 2), dtype=torch.uint8, device=DEV, generator=gen)
    s = torch.randint(118, 122, (*shape[:-1], shape[-1] // 32), dtype=torch.uint8, device=DEV, generator=gen)
    return w, s


def time_ms(fn, reps):
    """Median CUDA-event time (engine_gpu_bench's timer); one perf_counter call under the interpreter."""
    if DEV == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return cuda_time_ms(fn, reps, warmup=1)[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="4,32,128")
    ap.add_argument("--modes", default="0,1,2,3")
    ap.add_argument("--stages", default="4")
    ap.add_argument("--bn", default="128")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    global E, H, DEV
    L = 2048
    if a.tiny:
        E, H, L, DEV = 8, 256, 128, "cpu"
    gen = torch.Generator(device=DEV).manual_seed(0)
    w13, s13 = random_mxfp4(E, 2 * L, H, gen=gen)
    w2, s2 = random_mxfp4(E, H, L, gen=gen)
    fast = relayout_experts(w13, s13, w2, s2)
    del w13, w2
    bw = 4242.0
    if not a.tiny:
        bw = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    if not a.tiny:
        wi = fast.w13.view(torch.int32)
        ms = time_ms(lambda: torch.sum(wi, dtype=torch.int64), 10)
        print(f"torch.sum over w13 ({wi.numel() * 4 / 1e9:.2f} GB): {wi.numel() * 4 / ms / 1e6:.0f} GB/s", flush=True)
    interp = a.tiny
    rows = []
    for T in (int(t) for t in a.tokens.split(",")):
        x = torch.randn(T, H, device=DEV, dtype=torch.bfloat16, generator=gen)
        _, ids = torch.randn(T, E, device=DEV, generator=gen).softmax(-1).topk(TOPK, dim=-1)
        touched = int(torch.unique(ids).numel())
        bm = 16
        al = moe_align(ids, E, bm)
        nb = al.block_experts.numel()
        sp = al.sorted_pairs.long()
        okp = sp < T * TOPK
        hrand = torch.randn(T * TOPK, L, device=DEV, dtype=torch.bfloat16, generator=gen)
        for gemm in ("gate_up", "down"):
            if gemm == "gate_up":
                src = x
                src_rows = torch.where(okp, sp // TOPK, 0)
                w, s, n_out, k, streams, topk = fast.w13, fast.s13, L, H, 2, TOPK
            else:
                src = hrand
                src_rows = torch.where(okp, sp, 0)
                w, s, n_out, k, streams, topk = fast.w2, fast.s2, H, L, 1, 1
            xs = torch.where(okp[:, None], src[src_rows], 0).contiguous()
            floor_bytes = touched * (w[0].numel() + s[0].numel())
            floor_ms = floor_bytes / (bw * 1e9) * 1e3
            out = torch.zeros(T * TOPK, n_out, device=DEV, dtype=torch.float32)
            ref = None
            for bn in (int(b) for b in a.bn.split(",")):
                wd = TensorDescriptor.from_tensor(w.view(torch.int32).view(-1, 8), [bn, 8])
                sd = TensorDescriptor.from_tensor(s.view(-1, 16), [bn // 8, 16])
                wd2 = TensorDescriptor.from_tensor(w.view(torch.int32).view(-1, 8), [2 * bn, 8])
                sd2 = TensorDescriptor.from_tensor(s.view(-1, 16), [2 * bn // 8, 16])
                xd = TensorDescriptor.from_tensor(xs, [bm, 32])
                for st in (int(v) for v in a.stages.split(",")):
                    for mode in (int(m) for m in a.modes.split(",")):
                        def fn():
                            return _diag[(nb, triton.cdiv(n_out, bn))](
                                src, xd, wd, sd, wd2, sd2, out, al.sorted_pairs, al.block_experts, T * TOPK, topk, n_out, k,
                                src.stride(0), w.stride(0) // 32, w.stride(1) // 32, out.stride(0),
                                MODE=mode, STREAMS=streams, BM=bm, BN=bn, INTERPRET=interp, CH=128 if mode == 6 else 64, num_warps=4,
                                num_stages=st)
                        label = f"{gemm:<7} mode{mode} bn{bn} s{st}"
                        try:
                            out.zero_()
                            ck = fn()
                            info = "" if ck is None else f"regs {ck.n_regs} spills {ck.n_spills} smem {ck.metadata.shared}"
                            print(label, info, flush=True)
                            (torch.cuda.synchronize() if DEV == "cuda" else None)
                            same = None
                            if mode in (0, 1, 2) and mode != 2:
                                if ref is None:
                                    ref = out.clone()
                                else:
                                    same = bool(torch.equal(out, ref))
                            ms = time_ms(fn, 3 if a.tiny else a.reps)
                        except Exception as exc:  # noqa: BLE001
                            print(f"T={T:>4} {label} FAILED {str(exc)[:300]}", flush=True)
                            rows.append({"T": T, "label": label, "error": str(exc)[:500]})
                            continue
                        rows.append({"T": T, "gemm": gemm, "mode": mode, "bn": bn, "stages": st, "ms": ms,
                                     "floor_ms": floor_ms, "x_floor": ms / floor_ms, "equal_to_mode0": same,
                                     "gbs": floor_bytes / ms / 1e6})
                        print(f"T={T:>4} {label}  {ms:7.3f} ms  floor {floor_ms:6.3f}  x{ms / floor_ms:5.2f}  "
                              f"{floor_bytes / ms / 1e6:6.0f} GB/s  same={same}", flush=True)
    (a.out / "moe_diag.json").write_text(json.dumps({"bw": bw, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
