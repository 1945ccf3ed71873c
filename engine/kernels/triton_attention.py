"""Paged MLA decode attention in Triton (flash-decoding over the latent KV cache).

One query token per sequence attends over that sequence's cached tokens, each a row
[latent r | rope key p] shared by every head (absorbed MLA): the key is the whole row, the value
its first r values. Semantics are those of `TorchBackend.mla_attention`'s decode path: float32
scores `(q_lat . latent + q_pe . k_pe) * scale`, softmax over the context, output `probs . latent`.

Layout of the work:
- stage 1, grid (cdiv(H, BLOCK_H), B, num_splits): a program takes BLOCK_H heads of one sequence
  (the heads share the key/value, so each cached tile is loaded once for all of them and the heads
  become the M dimension of the two dots) and one contiguous slice of the context. It walks the
  slice in BLOCK_N-token tiles, looking each token's physical block up in the block table, loads
  the latent tile [BLOCK_N, r] and the rope tile [BLOCK_N, p] separately, and keeps an online
  softmax (running max and sum in float32, base 2) with a float32 accumulator [BLOCK_H, r]. The
  latent tile serves both the scores and the output. With one split it writes the final output;
  otherwise a normalised partial output and its log-sum-exp.
- stage 2, grid (B * H,): merges the splits' partials weighted by their log-sum-exps.

The cache may be stored as float32, bf16, fp16 or float8_e4m3fn; tiles are upcast in-kernel to the
query's dtype (as the torch backend casts the gathered cache to the query's dtype) and the products
accumulate in float32. Nothing here reads a tensor value on the host, and the number of splits comes
from shapes only, so the call can be captured in a CUDA graph.

Runs on a CUDA GPU, or on CPU under TRITON_INTERPRET=1 (set before triton compiles anything), which is
how tests/engine/kernels/test_triton_attention.py exercises it. On sm_90 with 64 bf16 / fp16 heads,
`mla_decode` runs stage 1 as `gluon_mla_decode.mla_decode_hopper` instead (`hopper_eligible`), which
writes out the layouts and copy pipeline that triton derives poorly for this loop (see that module);
both share the merge kernel below.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# Stage-1 defaults. BLOCK_H = 16 is the smallest M of a tensor-core dot; BLOCK_N = 32 keeps the
# latent tile at 32 x 512 (32 KiB in bf16) next to a 16 x 512 float32 accumulator.
BLOCK_H = 16
BLOCK_N = 32
NUM_WARPS = 4
# Split heuristic: aim for this many stage-1 programs per SM, but give each split at least
# MIN_SPLIT_TOKENS tokens of the (table-width) context and never more than MAX_SPLITS splits.
PROGRAMS_PER_SM = 2
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 32
DEFAULT_SMS = 132  # H200 / H100 SXM, used when there is no CUDA device (interpreter)
# The Hopper kernel's tile: 64 tokens in 2 shared buffers next to the 72 KiB query and the 8 KiB
# probabilities (224.5 KiB of the 227 an SM gives a block).
HOPPER_BLOCK_N = 64
HOPPER_NBUF = 2
HOPPER_PREFETCH = False  # the L2 prefetch was slower in every H200 run (bench/results/2026-12-01_h200_mla4)


@triton.jit
def _dot(a, b, acc, F32: tl.constexpr):
    """acc + a @ b in float32. F32: the operands (already rounded to the compute dtype) are widened
    and multiplied exactly (no tf32); used for float32 models and under the CPU interpreter, whose
    bf16/fp16 tl.dot gives garbage in triton 3.9 (products of bf16 values are exact in float32, so
    the result is what a bf16 tensor-core dot with float32 accumulation computes)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


# Integers that change with a step's shape (split count, block-table width, the lse buffer's strides) are
# not specialised: Triton would compile another variant the first time one is 1 or a multiple of 16, in
# the middle of a step (every stream waiting). The two store paths (DIRECT) are warmed before serving.
DECODE_UNSPECIALISED = ("num_splits", "s_tb", "s_lb", "s_lh")


@triton.jit(do_not_specialize=DECODE_UNSPECIALISED)
def _mla_decode_split(
    q_lat_ptr, q_pe_ptr, kv_ptr, tables_ptr, lens_ptr, out_ptr, lse_ptr,
    H, num_splits, qk_scale,
    s_qlb, s_qlh, s_qpb, s_qph,
    s_kvb, s_kvt, s_tb,
    s_ob, s_oh, s_os, s_lb, s_lh,
    R: tl.constexpr, P: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, F32: tl.constexpr,
):
    hb = tl.program_id(0)  # head blocks of one (sequence, split) run next to each other: shared tiles stay in L2
    b = tl.program_id(1)
    split = tl.program_id(2)
    cdt = q_lat_ptr.dtype.element_ty

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    rr = tl.arange(0, R)
    rp = tl.arange(0, P)
    q_lat = tl.load(q_lat_ptr + b * s_qlb + heads[:, None] * s_qlh + rr[None, :], mask=h_ok[:, None], other=0.0)
    q_pe = tl.load(q_pe_ptr + b * s_qpb + heads[:, None] * s_qph + rp[None, :], mask=h_ok[:, None], other=0.0)
    q_pe = q_pe.to(cdt)

    # this split's slice of the context, in whole BLOCK_N tiles; trailing splits may be empty
    ctx = tl.load(lens_ptr + b).to(tl.int32)
    tiles = tl.cdiv(ctx, BLOCK_N)
    per_split = tl.cdiv(tiles, num_splits)
    start = split * per_split * BLOCK_N
    end = tl.minimum(start + per_split * BLOCK_N, ctx)

    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, R), dtype=tl.float32)
    rn = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + rn
        t_ok = tok < end
        blk = tl.load(tables_ptr + b * s_tb + tok // PAGE, mask=t_ok, other=0)
        row = kv_ptr + blk.to(tl.int64) * s_kvb + (tok % PAGE) * s_kvt
        lat = tl.load(row[:, None] + rr[None, :], mask=t_ok[:, None], other=0.0).to(cdt)  # [BLOCK_N, R]
        kpe = tl.load(row[:, None] + R + rp[None, :], mask=t_ok[:, None], other=0.0).to(cdt)  # [BLOCK_N, P]
        s = _dot(q_lat, tl.trans(lat), tl.zeros((BLOCK_H, BLOCK_N), dtype=tl.float32), F32)
        s = _dot(q_pe, tl.trans(kpe), s, F32)
        s = s * qk_scale  # scale * log2(e): the softmax runs in base 2
        s = tl.where(t_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has at least one valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(cdt), lat, acc * alpha[:, None], F32)
        m_i = m_new

    nonempty = l_i > 0.0
    o = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    o_ptrs = out_ptr + b * s_ob + heads[:, None] * s_oh + rr[None, :]
    if DIRECT:
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=h_ok[:, None])
    else:
        tl.store(o_ptrs + split * s_os, o, mask=h_ok[:, None])
        lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + b * s_lb + heads * s_lh + split, lse, mask=h_ok)


@triton.jit(do_not_specialize=["num_splits", "s_pb", "s_ph", "s_lb", "s_lh"])  # as DECODE_UNSPECIALISED
def _mla_decode_merge(
    part_ptr, lse_ptr, out_ptr, H, num_splits,
    s_pb, s_ph, s_ps, s_lb, s_lh, s_ob, s_oh,
    R: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    rs = tl.arange(0, SPLITS_P2)
    lse = tl.load(lse_ptr + b * s_lb + h * s_lh + rs, mask=rs < num_splits, other=float("-inf"))
    m = tl.max(lse, 0)  # finite: split 0 always holds the first token (context_lens >= 1)
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0)
    rr = tl.arange(0, R)
    acc = tl.zeros((R,), dtype=tl.float32)
    for s in range(0, num_splits):
        ls = tl.load(lse_ptr + b * s_lb + h * s_lh + s)
        part = tl.load(part_ptr + b * s_pb + h * s_ph + s * s_ps + rr)
        acc += tl.exp2(ls - m) * part  # an empty split has lse -inf: weight 0 and a zero partial
    tl.store(out_ptr + b * s_ob + h * s_oh + rr, (acc / denom).to(out_ptr.dtype.element_ty))


def merge_splits(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Stage 2 of both stage-1 kernels: out [B, H, r] from the splits' partials part [B, H, S, r] (float32)
    weighted by their log-sum-exps lse [B, H, S]; a public door so the bench can time the merge alone."""
    B, H, num_splits, r = part.shape
    # One compiled merge for every split count up to MAX_SPLITS: a served step that meets a new count
    # would otherwise compile one (0.2 s on an H200 host, bench/engine_wave_bench.py).
    _mla_decode_merge[(B * H,)](part, lse, out, H, num_splits,
                                part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
                                out.stride(0), out.stride(1), R=r,
                                SPLITS_P2=max(MAX_SPLITS, triton.next_power_of_2(num_splits)), num_warps=4)
    return out


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_num_splits(batch: int, heads: int, max_blocks: int, block_size: int, *,
                       num_sms: int = DEFAULT_SMS, block_h: int = BLOCK_H) -> int:
    """Splits per sequence from shapes only: as many as keep the stage-1 programs within one round of
    the GPU's resident slots.

    Slots are one program per SM for 32 or more heads per program (their float32 accumulator fills the
    registers), else PROGRAMS_PER_SM. On an H200 at 64 heads and 8k contexts, one round measured best
    at every batch (bench/engine_mla_bench.py --sweep, bench/results/2026-12-01_h200_glue): batch 32
    in 4 splits 0.224 ms against 0.255 in 12 (three full rounds) and 0.272 in 3; batch 128 unsplit
    0.688 against 0.710 in 3; batch 4 in 32 splits 0.094 against 0.113 in 16. A split shorter than
    MIN_SPLIT_TOKENS of the table width (the longest context the block table can describe) costs more
    in merging than it gains; never more than MAX_SPLITS.
    """
    programs = max(1, batch * triton.cdiv(heads, block_h))
    slots = num_sms * (1 if block_h >= 32 else PROGRAMS_PER_SM)
    by_length = max(1, (max_blocks * block_size) // MIN_SPLIT_TOKENS)
    return max(1, min(slots // programs, by_length, MAX_SPLITS))


def mla_decode(
    q_lat: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = NUM_WARPS,
    num_stages: int | None = None,
    block_h: int | None = None,
    variant: str | None = None,
    nbuf: int = HOPPER_NBUF,
    prefetch: bool = HOPPER_PREFETCH,
) -> torch.Tensor:
    """Decode attention of one query token per sequence over its paged latent cache -> [B, H, r].

    q_lat [B, H, r], q_pe [B, H, p]; kv_cache [num_blocks, block_size, r + p]; block_tables
    [B, max_blocks] physical block ids (padding past a sequence's blocks is never read);
    context_lens [B] >= 1 tokens each. r and p must be powers of two (512 and 64 in DeepSeek-V3).
    num_splits: context slices per sequence (None: `default_num_splits`); block_n (None: the default
    tile of the kernel that runs), num_warps and
    num_stages tune stage 1 (bench/engine_mla_bench.py --sweep times them); block_h is
    the heads per program (16, 32 or 64: fewer re-reads of the cache, a larger accumulator). Left at
    their defaults, 64 or more heads in bf16 / fp16 run 64 per program (each latent tile read once for all heads of
    the sequence) in 64-token tiles with 8 warps: on an H200 at 64 heads and 8k contexts 0.71 against
    1.24 ms for 2 x 32 heads at batch 128, 0.31 against 0.41 at 32, 0.091 against 0.139 at 4
    (bench/results/2026-11-30_h200_engine/kernel_tune.json); float32 queries and 32 to 63 heads run 32 per program in
    64-token tiles with 8 warps (0.68 against 0.79 ms at 128 x 8k and 32 heads), fewer 16 per program
    in 32-token tiles.

    variant: "hopper" (`gluon_mla_decode`, explicit layouts and copy pipeline: see that module; on an
    H200 at 64 heads and 8k contexts 0.374 against 0.632 ms for the tl kernel at batch 128, 0.109 against
    0.171 at 32, 0.030 against 0.040 at 4, timed as the sweep rows that became the default:
    bench/results/2026-12-01_h200_mla4), or
    "triton" (the `tl` kernel above); None takes "hopper" where `hopper_eligible` holds and none of the
    tl kernel's knobs (block_h, num_warps, num_stages) is set. The hopper
    kernel takes block_n (64, or 32), nbuf (shared buffers, 2 at 64 tokens, up to 4 at 32) and prefetch
    (an L2 prefetch of the tile after the next, off: it was slower in every measurement).
    """
    B, H, r = q_lat.shape
    p = q_pe.shape[-1]
    _, page, width = kv_cache.shape
    hopper_block_n = HOPPER_BLOCK_N if block_n is None else block_n
    tl_tiles = block_h is not None or num_warps != NUM_WARPS or num_stages is not None  # the tl kernel's knobs
    if block_h is None:  # tiles measured best on an H200 by bench/engine_kernel_tune.py (8k contexts)
        if H >= 32 and block_n is None and num_warps == NUM_WARPS:
            # 64 float32 heads x 64-token tiles ask for 305 KiB of shared memory (an H200 has 227)
            wide = H >= 64 and q_lat.element_size() <= 2
            block_h, block_n, num_warps = (64 if wide else 32), 64, 8
            if wide and num_stages is None:  # 0.688 against 0.765 ms (2 stages) at batch 128 x 8k on an H200
                num_stages = 3
        else:
            block_h = BLOCK_H
    block_n = BLOCK_N if block_n is None else block_n
    if q_pe.shape[:2] != (B, H) or width != r + p:
        raise ValueError(f"shapes do not fit: q_lat {tuple(q_lat.shape)}, q_pe {tuple(q_pe.shape)}, "
                         f"kv_cache {tuple(kv_cache.shape)}")
    for name, n in (("kv_lora_rank", r), ("rope dim", p), ("block_n", block_n)):
        if n < 16 or n & (n - 1):
            raise ValueError(f"{name} = {n} must be a power of two >= 16 (a tl.dot tile dimension)")
    if kv_cache.stride(2) != 1:
        raise ValueError("kv_cache rows must be contiguous in the last dimension")
    q_lat = q_lat if q_lat.stride(2) == 1 else q_lat.contiguous()
    q_pe = q_pe if q_pe.stride(2) == 1 else q_pe.contiguous()
    if block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    context_lens = context_lens.contiguous()
    max_blocks = block_tables.shape[1]
    if num_splits is None:
        if q_lat.device.type == "cuda":
            idx = q_lat.device.index
            sms = _sm_count(torch.cuda.current_device() if idx is None else idx)
        else:
            sms = DEFAULT_SMS
        num_splits = default_num_splits(B, H, max_blocks, page, num_sms=sms, block_h=block_h)
    num_splits = max(1, int(num_splits))
    if variant is None:
        variant = "hopper" if not tl_tiles and hopper_eligible(q_lat, q_pe, kv_cache) else "triton"
    if variant == "hopper":
        if not hopper_eligible(q_lat, q_pe, kv_cache):
            raise ValueError("the hopper MLA decode kernel needs an sm_90 GPU, 64 heads, r=512, p=64, and a bf16/fp16 "
                             "query and cache of one dtype with 16-byte aligned rows")
        return _hopper(q_lat, q_pe, kv_cache, block_tables, context_lens, scale, num_splits,
                       block_n=hopper_block_n, nbuf=nbuf, prefetch=prefetch)
    if variant != "triton":
        raise ValueError(f"unknown MLA decode variant {variant!r}: hopper, triton")
    f32_dots = q_lat.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"
    out = torch.empty(B, H, r, dtype=q_lat.dtype, device=q_lat.device)
    grid = (triton.cdiv(H, block_h), B, num_splits)
    common = dict(R=r, P=p, PAGE=page, BLOCK_H=block_h, BLOCK_N=block_n, F32=f32_dots, num_warps=num_warps)
    if num_stages is not None:
        common["num_stages"] = num_stages
    args = (q_lat, q_pe, kv_cache, block_tables, context_lens)
    strides = (q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1),
               kv_cache.stride(0), kv_cache.stride(1), block_tables.stride(0))
    if num_splits == 1:
        _mla_decode_split[grid](*args, out, out, H, 1, scale * LOG2E, *strides,
                                out.stride(0), out.stride(1), 0, 0, 0, DIRECT=True, **common)
        return out
    part = torch.empty(B, H, num_splits, r, dtype=torch.float32, device=q_lat.device)
    lse = torch.empty(B, H, num_splits, dtype=torch.float32, device=q_lat.device)
    _mla_decode_split[grid](*args, part, lse, H, num_splits, scale * LOG2E, *strides,
                            part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
                            DIRECT=False, **common)
    return merge_splits(part, lse, out)


def hopper_eligible(q_lat: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether `gluon_mla_decode` runs this call: an sm_90 GPU (not the interpreter), the DeepSeek-V3
    widths at 64 heads per rank, a bf16 / fp16 query and a cache of the same dtype (cp.async copies
    bytes, it cannot convert), and cache rows on 16-byte boundaries (cp.async moves 16-byte pieces)."""
    if not q_lat.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    B, H, r = q_lat.shape
    if (H, r, q_pe.shape[-1]) != (64, 512, 64) or q_lat.dtype not in (torch.bfloat16, torch.float16):
        return False
    if kv_cache.dtype != q_lat.dtype or q_pe.dtype != q_lat.dtype or kv_cache.stride(2) != 1:
        return False
    if kv_cache.stride(0) % 8 or kv_cache.stride(1) % 8 or kv_cache.data_ptr() % 16:
        return False
    return _hopper_available(q_lat.device.index if q_lat.device.index is not None else torch.cuda.current_device())


@functools.cache
def _hopper_available(device_index: int) -> bool:
    if torch.cuda.get_device_capability(device_index)[0] != 9 or torch.version.hip:
        return False
    try:
        from k2bench.engine.kernels import gluon_mla_decode  # noqa: F401  (needs triton's Gluon, 3.5 or newer)
    except ImportError:
        return False
    return True


def _hopper(q_lat: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
            context_lens: torch.Tensor, scale: float, num_splits: int, *, block_n: int, nbuf: int,
            prefetch: bool) -> torch.Tensor:
    """Stage 1 in Gluon (grid: sequences x splits), then the shared merge kernel when split."""
    from k2bench.engine.kernels.gluon_mla_decode import mla_decode_hopper

    B, H, r = q_lat.shape
    p = q_pe.shape[-1]
    page = kv_cache.shape[1]
    if nbuf < 2 or (block_n, nbuf) not in ((64, 2), (32, 2), (32, 3), (32, 4)):
        raise ValueError(f"hopper MLA decode: block_n {block_n} with {nbuf} buffers does not fit in shared memory "
                         "(64 x 2, or 32 x 2..4)")
    out = torch.empty(B, H, r, dtype=q_lat.dtype, device=q_lat.device)
    consts = dict(H=H, R=r, P=p, PAGE=page, BLOCK_N=block_n, NBUF=nbuf, PREFETCH=bool(prefetch), num_warps=8)
    # the query travels by cp.async, which moves 16-byte pieces: a view off those boundaries is copied first
    q_lat, q_pe = _aligned16(q_lat), _aligned16(q_pe)
    strides = (q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1),
               kv_cache.stride(0), kv_cache.stride(1), block_tables.stride(0))
    args = (q_lat, q_pe, kv_cache, block_tables, context_lens)
    if num_splits == 1:
        mla_decode_hopper[(B, 1)](*args, out, out, 1, scale * LOG2E, *strides, out.stride(0), out.stride(1), 0, 0, 0,
                                  DIRECT=True, **consts)
        return out
    part = torch.empty(B, H, num_splits, r, dtype=torch.float32, device=q_lat.device)
    lse = torch.empty(B, H, num_splits, dtype=torch.float32, device=q_lat.device)
    mla_decode_hopper[(B, num_splits)](*args, part, lse, num_splits, scale * LOG2E, *strides,
                                       part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
                                       DIRECT=False, **consts)
    return merge_splits(part, lse, out)


def _aligned16(x: torch.Tensor) -> torch.Tensor:
    """x itself when its start and outer strides sit on 16-byte boundaries, else a contiguous copy."""
    ok = x.data_ptr() % 16 == 0 and all(st * x.element_size() % 16 == 0 for st in x.stride()[:-1])
    return x if ok else torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)
