"""The fused MoE's glue, shared by both kernel families (`triton_moe`, `triton_moe_fast`; which runs where:
`moe_dispatch`): four Triton kernels (pair alignment (two), the bridge between the GEMMs, the combine), the
host-side run around the two GEMMs (`run_moe`: checks, K slices, buffers) and the GEMM kernels' shared
pieces (`block_pairs`, `k_range`, `store_gate_up`).

In torch this glue was about thirty launches per MoE layer at decode (sort, searchsorted, cumsum, scatter
and a dozen index ops to sort the (token, expert) pairs; sum, sigmoid, multiply and the activation quantiser
between the GEMMs; a sum over the top-k experts and a cast after them), each moving a few kilobytes, so it
cost more in count than in bytes (issue 11 asks for at most 50 kernels per decoder layer). Both fused MoE
paths (`triton_moe`, `triton_moe_fast`) use these kernels; every shape depends only on (T, k, E, block_m),
so no host sync and a decode step can be captured in a CUDA graph. Nothing here uses atomics: every
output element has one writer and every sum a fixed order, so results repeat bit for bit. Token and pair
counts are not specialised (`do_not_specialize`): Triton would compile a second kernel the first time a
count is not a multiple of 16, inside a served step (1.8 s for the MoE's kernels on an H200 host,
bench/engine_wave_bench.py).

- `moe_align`: `_align_count` histograms the expert ids of each chunk of pairs; `_align_place` turns the
  histograms into padded expert offsets (in registers, every program on its own) and writes each pair to
  its slot in pair order (stable: within an expert, lower pair index first), the sentinel into every
  padding slot, and every block's expert; its programs split the chunks and the blocks between them.
- `moe_bridge`: split-K gate/up partials -> sum over slices -> silu(gate) * up -> bf16, or in A4W4 the
  MXFP4 quantise-dequantise of h (`triton_quant.mx_fake_quant`, bit-equal to the torch quantiser).
- `run_moe`: argument checks, alignment, K slices (`split_sizes`), the activations as the GEMMs read them,
  the h and y buffers, then gate/up, bridge, down and combine; the family describes its two GEMMs
  (`MoeGemm`: kernel, weights, strides, tiles), whose launches are made here.
- `moe_combine`: y partials [slices, pairs, H] (routing weights applied) -> sum over slices, then over a
  token's k experts in order -> x's dtype, plus an optional addend (the shared experts' output) rounded
  as torch's `out + add` would round it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from k2bench.engine.kernels.triton_quant import fake_quantize, mx_fake_quant, round_bf16, round_to
from k2bench.engine.model.mxfp4 import BLOCK

# Alignment work split: pairs in chunks of a power of two from 64 up, so that there are at most
# ALIGN_MAX_CHUNKS chunks (each program then reads every chunk's histogram: few and short); blocks
# labelled ALIGN_BLOCKS per program. On an H200 one program over 256 pairs and 106 blocks took 81 us
# at 1024 pairs (bench/results/2026-12-01_h200_glue3): the work has to be spread over programs.
ALIGN_MIN_CHUNK = 64
ALIGN_MAX_CHUNKS = 64
ALIGN_STEP = 32  # pairs handled at once inside a program ([STEP, E] one-hot tiles)
ALIGN_BLOCKS = 32  # blocks labelled per program
BRIDGE_ROWS = 32  # pairs per bridge program (one 32-wide group of h per program)
COMBINE_COLS = 1024  # hidden columns per combine program


@dataclass(frozen=True)
class MoeAlignment:
    """Pairs sorted by expert and padded per expert; all shapes static in (T, k, E, block_m)."""

    sorted_pairs: torch.Tensor  # int32 [padded_len]: pair index t*k + j, or `sentinel` for padding
    block_experts: torch.Tensor  # int32 [padded_len // block_m]: the block's expert, -1 if unused
    sentinel: int  # = T * k
    block_m: int


def moe_align_sizes(num_pairs: int, num_experts: int, block_m: int) -> tuple[int, int]:
    """(padded_len, num_blocks): at most min(E, pairs) groups are non-empty, each wasting < block_m slots."""
    worst = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    blocks = triton.cdiv(worst, block_m)
    return blocks * block_m, blocks


@triton.jit(do_not_specialize=["pairs"])  # token counts: one compiled kernel for every batch size
def _align_count(ids_ptr, counts_ptr, pairs, CHUNK: tl.constexpr, STEP: tl.constexpr, BE: tl.constexpr):
    """counts[c, e] = how many of chunk c's pairs chose expert e."""
    c = tl.program_id(0)
    e = tl.arange(0, BE)
    hist = tl.zeros((BE,), tl.int32)
    for s in range(0, CHUNK, STEP):
        i = c * CHUNK + s + tl.arange(0, STEP)
        v = tl.load(ids_ptr + i, mask=i < pairs, other=-1)
        hist += tl.sum((v[:, None] == e[None, :]).to(tl.int32), axis=0)
    tl.store(counts_ptr + c * BE + e, hist)


@triton.jit(do_not_specialize=["pairs", "num_chunks", "num_blocks"])
def _align_place(
    ids_ptr, counts_ptr, sorted_ptr, block_experts_ptr, pairs, E, num_chunks, num_blocks,
    BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, STEP: tl.constexpr, BE: tl.constexpr, BB: tl.constexpr,
):
    """Program c: the slots of chunk c's pairs (if there is a chunk c), then the labels and padding of
    blocks [c * BB, (c + 1) * BB)."""
    c = tl.program_id(0)
    e = tl.arange(0, BE)
    total = tl.zeros((BE,), tl.int32)
    before = tl.zeros((BE,), tl.int32)  # pairs of each expert in the chunks ahead of this one
    for j in range(0, num_chunks):
        row = tl.load(counts_ptr + j * BE + e)
        total += row
        before += tl.where(j < c, row, 0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, 0)
    start = end - padded
    # each pair's slot: its expert's start + pairs of that expert before it (earlier chunks, earlier steps,
    # earlier in this step)
    base = start + before
    r = tl.arange(0, STEP)
    for s in range(0, tl.where(c < num_chunks, CHUNK, 0), STEP):
        i = c * CHUNK + s + r
        ok = i < pairs
        v = tl.load(ids_ptr + i, mask=ok, other=-1)
        hit = v[:, None] == e[None, :]
        first = tl.sum(tl.where(hit, base[None, :], 0), axis=1)
        rank = tl.sum(((v[:, None] == v[None, :]) & (r[None, :] < r[:, None])).to(tl.int32), axis=1)
        tl.store(sorted_ptr + first + rank, i.to(tl.int32), mask=ok)
        base += tl.sum(hit.to(tl.int32), axis=0)
    # blocks: owner = the first expert whose padded group ends after the block's start (E: none)
    end_real = tl.where(e < E, end, 2147483647)
    b = c * BB + tl.arange(0, BB)
    b_ok = b < num_blocks
    b_start = b * BLOCK_M
    owner = tl.sum((end_real[None, :] <= b_start[:, None]).to(tl.int32), axis=1)
    own = e[None, :] == owner[:, None]
    o_start = tl.sum(tl.where(own, start[None, :], 0), axis=1)
    o_count = tl.sum(tl.where(own, total[None, :], 0), axis=1)  # 0 for owner >= E (ids lie below E)
    tl.store(block_experts_ptr + b, tl.where(owner < E, owner, -1), mask=b_ok)
    slot = b_start[:, None] + tl.arange(0, BLOCK_M)[None, :]
    pad = slot - o_start[:, None] >= o_count[:, None]
    tl.store(sorted_ptr + slot, tl.zeros((BB, BLOCK_M), tl.int32) + pairs, mask=b_ok[:, None] & pad)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """Sort the (token, expert) pairs by expert into BLOCK_M-aligned groups, on the device, in two kernels.

    Ids must lie in [0, num_experts); that is not checked (it would need a host sync). Runs on a GPU or
    under TRITON_INTERPRET=1.
    """
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [T, k], got shape {tuple(topk_ids.shape)}")
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two, got {block_m}")
    dev = topk_ids.device
    flat = topk_ids.reshape(-1)
    pairs = flat.numel()
    padded_len, num_blocks = moe_align_sizes(pairs, num_experts, block_m)
    sorted_pairs = torch.empty(padded_len, dtype=torch.int32, device=dev)
    block_experts = torch.empty(num_blocks, dtype=torch.int32, device=dev)
    if pairs:
        chunk = max(ALIGN_MIN_CHUNK, triton.next_power_of_2(triton.cdiv(pairs, ALIGN_MAX_CHUNKS)))
        chunks = triton.cdiv(pairs, chunk)
        be = triton.next_power_of_2(num_experts)
        counts = torch.empty(chunks, be, dtype=torch.int32, device=dev)
        _align_count[(chunks,)](flat, counts, pairs, CHUNK=chunk, STEP=ALIGN_STEP, BE=be)
        _align_place[(max(chunks, triton.cdiv(num_blocks, ALIGN_BLOCKS)),)](
            flat, counts, sorted_pairs, block_experts, pairs, num_experts, chunks, num_blocks,
            BLOCK_M=block_m, CHUNK=chunk, STEP=ALIGN_STEP, BE=be, BB=ALIGN_BLOCKS,
        )
    return MoeAlignment(sorted_pairs, block_experts, pairs, block_m)


@triton.jit(do_not_specialize=["P"])
def _bridge(
    src_ptr, h_ptr, P, L, S, s_ss, s_sp, s_hp,
    ACT: tl.constexpr, A4W4: tl.constexpr, ROWS: tl.constexpr,
):
    """One 32-wide group of h for ROWS pairs: sum the S slices, silu(gate) * up (ACT), then MXFP4 (A4W4)
    or bf16 rounding, stored in h's dtype."""
    p = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    n = tl.program_id(1) * 32 + tl.arange(0, 32)
    ok = (p < P)[:, None]
    at = src_ptr + p.to(tl.int64)[:, None] * s_sp + n[None, :]
    g = tl.zeros((ROWS, 32), tl.float32)
    u = tl.zeros((ROWS, 32), tl.float32)
    for s in range(0, S):
        g += tl.load(at + s * s_ss, mask=ok, other=0.0).to(tl.float32)
        if ACT:
            u += tl.load(at + s * s_ss + L, mask=ok, other=0.0).to(tl.float32)
    if ACT:
        g = g * tl.sigmoid(g) * u
    if A4W4:
        g = mx_fake_quant(g)
    else:
        g = round_bf16(g)
    tl.store(h_ptr + p.to(tl.int64)[:, None] * s_hp + n[None, :], g.to(h_ptr.dtype.element_ty), mask=ok)


def moe_bridge(src: torch.Tensor, inter: int, *, act: bool, a4w4: bool) -> torch.Tensor:
    """The gate/up GEMM's output -> the down GEMM's bf16 input h [pairs, inter], in one kernel.

    src: float32 [slices, pairs, 2 * inter] partial gate | up sums (act=True), or [slices, pairs, inter]
    values of silu(gate) * up already formed by the GEMM (act=False). h = silu(gate) * up of the summed
    slices in float32, then MXFP4 fake-quantised (a4w4) or rounded to bf16, exactly as torch would.
    """
    if src.dim() == 2:
        src = src.unsqueeze(0)
    slices, pairs, width = src.shape
    if width != (2 * inter if act else inter) or inter % BLOCK or src.stride(-1) != 1:
        raise ValueError(f"bridge input {tuple(src.shape)} does not fit inter={inter} (act={act})")
    h = torch.empty(pairs, inter, dtype=torch.bfloat16, device=src.device)
    if pairs:
        _bridge[(triton.cdiv(pairs, BRIDGE_ROWS), inter // BLOCK)](
            src, h, pairs, inter, slices, src.stride(0), src.stride(1), h.stride(0),
            ACT=act, A4W4=a4w4, ROWS=BRIDGE_ROWS,
        )
    return h


@triton.jit
def _combine(
    y_ptr, add_ptr, out_ptr, H, S, s_ys, s_yp, s_at, s_ot,
    TOPK: tl.constexpr, ADD: tl.constexpr, BF16: tl.constexpr, BH: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    ok = cols < H
    acc = tl.zeros((BH,), tl.float32)
    for j in tl.static_range(TOPK):
        part = tl.zeros((BH,), tl.float32)
        for s in range(0, S):
            part += tl.load(y_ptr + s * s_ys + (t * TOPK + j) * s_yp + cols, mask=ok, other=0.0)
        acc += part
    acc = round_to(acc, out_ptr.dtype.element_ty, BF16)
    if ADD:
        acc += tl.load(add_ptr + t * s_at + cols, mask=ok, other=0.0).to(tl.float32)
        acc = round_to(acc, out_ptr.dtype.element_ty, BF16)
    tl.store(out_ptr + t * s_ot + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def moe_combine(y: torch.Tensor, topk: int, dtype: torch.dtype, add: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = sum_j sum_s y[s, t*k + j] in float32 (slices first, then experts in order), cast to `dtype`;
    then `out + add` rounded to `dtype` when `add` [T, H] is given. y: float32 [slices, pairs, H]."""
    if y.dim() == 2:
        y = y.unsqueeze(0)
    slices, pairs, hidden = y.shape
    tokens = pairs // topk
    if pairs != tokens * topk or y.stride(-1) != 1:
        raise ValueError(f"combine input {tuple(y.shape)} does not hold whole tokens of {topk} pairs")
    if add is not None and (tuple(add.shape) != (tokens, hidden) or add.stride(-1) != 1):
        raise ValueError(f"addend {tuple(add.shape)} must be [{tokens}, {hidden}] with unit stride")
    out = torch.empty(tokens, hidden, dtype=dtype, device=y.device)
    if tokens:
        _combine[(tokens, triton.cdiv(hidden, COMBINE_COLS))](
            y, add if add is not None else out, out, hidden, slices, y.stride(0), y.stride(1),
            add.stride(0) if add is not None else 0, out.stride(0),
            TOPK=topk, ADD=add is not None, BF16=dtype == torch.bfloat16, BH=min(COMBINE_COLS, triton.next_power_of_2(hidden)),
        )
    return out


def split_sizes(k: int, bk: int, split_k: int) -> tuple[int, int]:
    """(slices, K per slice) for a requested split: whole BK tiles per slice, no empty slice (the last
    may be shorter, e.g. 7 tiles over 3 slices -> 3, 3, 1)."""
    tiles = triton.cdiv(k, bk)
    per = triton.cdiv(tiles, max(1, min(split_k, tiles)))
    return triton.cdiv(tiles, per), per * bk


def check_split(split_k: int | None, down_split_k: int | None) -> None:
    for name, val in (("split_k", split_k), ("down_split_k", down_split_k)):
        if val is not None and val < 1:
            raise ValueError(f"{name} must be >= 1, got {val}")


def check_routing(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, hidden: int) -> None:
    if x.dim() != 2 or x.shape[1] != hidden or topk_ids.dim() != 2 or topk_ids.shape != topk_weights.shape \
            or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"x [T, {hidden}], topk_ids and topk_weights [T, k] expected; got {tuple(x.shape)}, "
                         f"{tuple(topk_ids.shape)}, {tuple(topk_weights.shape)}")


@triton.jit
def k_range(K, K_SPLIT, SPLIT: tl.constexpr):
    """The K range of this program: slice program_id(2) of K_SPLIT values when SPLIT, else all of K."""
    if SPLIT:
        k_lo = tl.program_id(2) * K_SPLIT
        k_hi = tl.minimum(k_lo + K_SPLIT, K)
    else:
        k_lo = 0
        k_hi = K
    return k_lo, k_hi


@triton.jit
def block_pairs(pairs_ptr, num_pairs, BM: tl.constexpr, BN: tl.constexpr):
    """A GEMM program's work: its block's sorted pairs (block program_id(0); padding slots are not valid)
    and its BN output columns (tile program_id(1))."""
    pair = tl.load(pairs_ptr + tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    return pair, pair < num_pairs, tl.program_id(1) * BN + tl.arange(0, BN)


@triton.jit
def store_gate_up(h_ptr, offs, acc_g, acc_u, mask, L, s_hs, SPLIT: tl.constexpr):
    """The gate/up GEMM's output at h_ptr + offs (pair * row stride + column, in the caller's tile
    orientation): SPLIT: float32 partial gate sums in slice program_id(2) and up sums L columns after
    them (silu waits for the complete sums, in the bridge); else silu(gate) * up in h's dtype."""
    if SPLIT:
        dst = h_ptr + tl.program_id(2) * s_hs + offs
        tl.store(dst, acc_g, mask=mask)
        tl.store(dst + L, acc_u, mask=mask)
    else:
        h = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=mask)


def interpreting() -> bool:
    """Whether the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class MoeGemm:
    """One of a family's two GEMMs as `run_moe` launches it, on grid (blocks, output tiles of block_n,
    K slices). The kernel's arguments, in order: the activations, `weights`, the output, the sorted pairs,
    the block experts, (down: the routing weights,) the pair count, (gate/up: top-k,) the output width,
    K, K per slice, the activations' row stride, `strides`, the output's pair and slice strides; then
    SPLIT, BM, BN and `meta` (the family's other compile-time values and launch options)."""

    kernel: Callable
    weights: tuple
    strides: tuple
    block_n: int
    block_k: int  # the K tile that the slices hold whole
    meta: dict


def run_moe(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *, num_experts: int, hidden: int,
    inter: int, block_m: int, splits: Callable[[int], tuple[int, int]], a4w4: bool, x_quantized: bool,
    add: torch.Tensor | None, gate_up: MoeGemm, down: MoeGemm,
) -> torch.Tensor:
    """out[t] = sum_j topk_weights[t, j] * down_j(silu(gate_j(x_t)) * up_j(x_t)) around a family's GEMMs.

    splits(num_blocks) -> the wanted K slices of (gate/up, down), cut here into whole block_k tiles.
    gate_up writes h: float32 partial gate | up sums [slices, pairs, 2L] when split, else
    silu(gate) * up [pairs, L] (float32 in A4W4, which the bridge then quantises, and under the
    interpreter, whose bf16 cast truncates where the GPU's rounds). down writes weighted float32 rows
    y [slices, pairs, H]. x_quantized: x already holds its A4W4 values (`rms_norm(quantize=True)`), bf16
    holds them exactly.
    """
    check_routing(x, topk_ids, topk_weights, hidden)
    tokens, topk = topk_ids.shape
    pairs = tokens * topk
    if pairs == 0:
        return torch.zeros_like(x) if add is None else add.to(x.dtype, copy=True)
    align = moe_align(topk_ids, num_experts, block_m)
    blocks = align.block_experts.numel()
    want1, want2 = splits(blocks)
    split1, ksplit1 = split_sizes(hidden, gate_up.block_k, want1)
    split2, ksplit2 = split_sizes(inter, down.block_k, want2)
    xa = fake_quantize(x, torch.bfloat16) if a4w4 and not x_quantized else x.to(torch.bfloat16).contiguous()
    if split1 > 1:
        h_buf = torch.empty(split1, pairs, 2 * inter, dtype=torch.float32, device=x.device)
        s_hp, s_hs = h_buf.stride(1), h_buf.stride(0)
    else:
        h_buf = torch.empty(pairs, inter, dtype=torch.float32 if a4w4 or interpreting() else torch.bfloat16,
                            device=x.device)
        s_hp, s_hs = h_buf.stride(0), 0
    g = gate_up
    g.kernel[(blocks, triton.cdiv(inter, g.block_n), split1)](
        xa, *g.weights, h_buf, align.sorted_pairs, align.block_experts, pairs, topk, inter, hidden, ksplit1,
        xa.stride(0), *g.strides, s_hp, s_hs, SPLIT=split1 > 1, BM=block_m, BN=g.block_n, **g.meta)
    h = h_buf if h_buf.dtype == torch.bfloat16 else moe_bridge(h_buf, inter, act=split1 > 1, a4w4=a4w4)
    route_w = topk_weights.reshape(-1).to(torch.float32).contiguous()
    y = torch.empty(split2, pairs, hidden, dtype=torch.float32, device=x.device)
    d = down
    d.kernel[(blocks, triton.cdiv(hidden, d.block_n), split2)](
        h, *d.weights, y, align.sorted_pairs, align.block_experts, route_w, pairs, hidden, inter, ksplit2,
        h.stride(0), *d.strides, y.stride(1), y.stride(0), SPLIT=split2 > 1, BM=block_m, BN=d.block_n, **d.meta)
    return moe_combine(y, topk, x.dtype, add)
