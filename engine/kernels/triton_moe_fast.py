"""Fused routed-expert MoE on a load-time weight layout: E2M1 -> bf16 in a few integer ops (Hopper path).

The weights come in the layout of `moe_fast_layout` (built once at load): 64-wide K chunks, by default
as 32-bit words that decode straight into the wgmma register operand (`triton_moe_words`,
`words=True`), else as nibble halves that are one whole scale group each; both decode to bits
(sign << 15) | (magnitude << 6) times a bf16 scale 2^(e-1). Why: on GPUs without FP4 units
`tl.dot_scaled` decodes every element through an upcast, a scale broadcast, a multiply, a NaN select
and a layout conversion (bench/results/2026-11-30_h200_engine).

On a GPU the nibble decode runs on packed registers (`e2m1_decode_packed`, inline PTX: prmt spreads two
bytes into the 16-bit lanes of a word; per nibble half a mask, an integer multiply that places the
sign and the magnitude at once, a mask and one bf16x2 multiply by the scale), 2.25 instructions per
value; `asm=False` keeps the per-element Triton form. The GEMMs put expert weight rows on the MMA's M
side (64 rows per wgmma tile, decoded in registers, the wgmma A operand) and the block's tokens on the
N side (`swap=True`); `swap=False` is the usual orientation. With `desc`, weights and scales come
through tensor descriptors (TMA on Hopper): Triton's pipeliner then keeps `num_stages` chunks in
flight in shared memory and reads them straight into the wgmma operand layout, where pointer loads
get no asynchronous copies (their values reach the MMA through the inline asm) and go through
registers, shared memory and back. Pairs are sorted and padded per expert by
`triton_moe_glue.moe_align`; split-K writes float32 partials like `triton_moe` does, and so does the
down GEMM: the bridge kernel between the GEMMs and the combine kernel after them (`triton_moe_glue`)
add them up, the k experts of a token in a fixed order (an epilogue reduce across programs would need
atomics, whose order, and so whose float32 result, changes from run to run).
Under TRITON_INTERPRET=1 (no inline asm; bf16 arithmetic on raw bits) the same bits are decoded in
float32; the GPU decodes are checked against the OCP table by tests/engine/kernels/
test_triton_moe_fast.py on a GPU. Not run on ROCm: the PTX decode is CUDA-only, so an MI355X keeps
`triton_moe`'s `tl.dot_scaled` (its native scaled MFMA), which the triton backend picks where the
GPU has FP4 units.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from k2bench.engine.kernels.moe_fast_layout import CHUNK, FastExperts
from k2bench.engine.kernels.triton_moe import split_sizes
from k2bench.engine.kernels.triton_moe_glue import moe_align, moe_bridge, moe_combine
from k2bench.engine.kernels.triton_moe_words import word_scales, words_to_operand
from k2bench.engine.kernels.triton_quant import fake_quantize


@triton.jit
def e2m1_decode_half(p, s, HIGH: tl.constexpr, INTERPRET: tl.constexpr):
    """Bytes [R, 32] and E8M0 codes [R] -> the low (or HIGH) nibbles' values [R, 32] (bf16; float32 when
    INTERPRET): bits (sign << 15) | (magnitude << 6) are value * 2^-126, times bf16 2^(e-1)."""
    q = p.to(tl.uint16)
    if HIGH:
        bits = ((q & 0x70) << 2) | ((q & 0x80) << 8)
    else:
        bits = ((q & 0x7) << 6) | ((q & 0x8) << 12)
    e = s.to(tl.uint16) + 126
    if INTERPRET:
        w = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        return w * (e.to(tl.uint32) << 23).to(tl.float32, bitcast=True)[:, None]
    return bits.to(tl.bfloat16, bitcast=True) * (e << 7).to(tl.bfloat16, bitcast=True)[:, None]


# The same decode on packed registers (CUDA sm_90+): 2 bytes in, both nibble halves out as bf16x2 pairs.
# prmt spreads bytes b0, b1 into the two 16-bit lanes of a word. Per half, the nibble is masked out
# (bits 0-3 or 4-7 of each lane) and multiplied by 2^6 + 2^12 (or 2^2 + 2^8): the two shifted copies
# do not overlap, one puts the magnitude at bits 6-8, the other the sign at bit 15, and a mask drops
# the rest. Then one bf16x2 multiply by the scale: 9 SASS instructions per 4 values (the shift-and-or form
# of `e2m1_decode_half` took 11, the per-element form a widening, the bit ops and a multiply each). The
# 16-bit operand lets ptxas keep the pair as loaded from shared memory (a 4-byte operand cost three
# byte permutes per pair to assemble, counted in the sm_90 SASS).
_DECODE_PTX = tl.constexpr("""{
.reg .b32 a, t;
cvt.u32.u16 a, $2;
prmt.b32 a, a, 0, 0x4140;
and.b32 t, a, 0x000F000F;
mul.lo.u32 t, t, 0x1040;
and.b32 t, t, 0x81C081C0;
mul.rn.bf16x2 $0, t, $3;
and.b32 t, a, 0x00F000F0;
mul.lo.u32 t, t, 0x104;
and.b32 t, t, 0x81C081C0;
mul.rn.bf16x2 $1, t, $4;
}""")


@triton.jit
def e2m1_decode_packed(p, s_lo, s_hi, BN: tl.constexpr):
    """Both halves of `e2m1_decode_half` at once, in inline PTX (GPU only; the interpreter has no asm).
    Each element keeps its own scale, so the result does not depend on how Triton lays the tile out."""
    sc_lo = tl.broadcast_to(((s_lo.to(tl.uint16) + 126) << 7).to(tl.bfloat16, bitcast=True)[:, None], (BN, 32))
    sc_hi = tl.broadcast_to(((s_hi.to(tl.uint16) + 126) << 7).to(tl.bfloat16, bitcast=True)[:, None], (BN, 32))
    return tl.inline_asm_elementwise(
        _DECODE_PTX, "=r,=r,h,r,r", [p, sc_lo, sc_hi],
        dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2,
    )


@triton.jit
def _load_w(w_rows, s_rows, rn, ok):
    """One 64-wide K chunk of BN weight rows: bytes [BN, 32] and the two scale codes [BN] of each row."""
    p = tl.load(w_rows + rn[:, None] * 32 + tl.arange(0, 32)[None, :], mask=ok[:, None], other=0)
    s_lo = tl.load(s_rows + rn * 2, mask=ok, other=127)
    s_hi = tl.load(s_rows + rn * 2 + 1, mask=ok, other=127)
    return p, s_lo, s_hi


@triton.jit
def _load_w_desc(w_desc, s_desc, w_row, BN: tl.constexpr):
    """`_load_w` through tensor descriptors (TMA on Hopper, so Triton's pipeliner keeps `num_stages`
    chunks in flight): w_row is the tile's first row in the [rows, 32] byte view; its BN scale pairs are
    BN * 2 contiguous bytes, read as [BN / 8, 16] (a copy's row must span 16 bytes) and split."""
    p = w_desc.load([w_row, 0])
    s = tl.reshape(s_desc.load([w_row // 8, 0]), (BN, 2))
    s_lo, s_hi = tl.split(s)
    return p, s_lo, s_hi


@triton.jit
def _load_x(x_ptrs, x_ok, kc, K):
    """The block's activations at k = kc..kc+31 and kc+32..kc+63 as [32, BM] (zero past K)."""
    rj = tl.arange(0, 32)
    x_lo = tl.load(x_ptrs + kc, mask=x_ok & (kc + rj < K)[:, None], other=0.0)
    x_hi = tl.load(x_ptrs + kc + 32, mask=x_ok & (kc + 32 + rj < K)[:, None], other=0.0)
    return x_lo, x_hi


@triton.jit
def _mma_chunk(acc, p, s_lo, s_hi, x_lo, x_hi,
               SWAP: tl.constexpr, INTERPRET: tl.constexpr, ASM: tl.constexpr, BN: tl.constexpr,
               WORDS: tl.constexpr):
    """acc += W_chunk . x_chunk. SWAP: acc is [BN, BM] (weights as the MMA's A operand); else [BM, BN].
    WORDS: p is the chunk's [BN, 8] words (`triton_moe_words`; swapped tiles only)."""
    if WORDS:
        w_lo, w_hi = words_to_operand(p, word_scales(s_lo, s_hi, BN), BN, INTERPRET, ASM)
    elif ASM and not INTERPRET:
        w_lo, w_hi = e2m1_decode_packed(p, s_lo, s_hi, BN)
    else:
        w_lo = e2m1_decode_half(p, s_lo, False, INTERPRET)
        w_hi = e2m1_decode_half(p, s_hi, True, INTERPRET)
    if INTERPRET:
        x_lo = x_lo.to(tl.float32)
        x_hi = x_hi.to(tl.float32)
    else:
        x_lo = x_lo.to(tl.bfloat16)
        x_hi = x_hi.to(tl.bfloat16)
    if SWAP:
        acc = tl.dot(w_lo, x_lo, acc)
        acc = tl.dot(w_hi, x_hi, acc)
    else:
        acc = tl.dot(tl.trans(x_lo), tl.trans(w_lo), acc)
        acc = tl.dot(tl.trans(x_hi), tl.trans(w_hi), acc)
    return acc


@triton.jit(do_not_specialize=["num_pairs"])  # one compiled kernel for every batch size (triton_moe_glue)
def _fast_gate_up(
    x_ptr, w_ptr, s_ptr, h_ptr, pairs_ptr, block_experts_ptr,
    num_pairs, topk, L, K, K_SPLIT,
    s_xt, s_we, s_wc, s_se, s_sc, s_hp, s_hs,
    SWAP: tl.constexpr, INTERPRET: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr, PREFETCH: tl.constexpr,
    DESC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WORDS: tl.constexpr,
):
    """h[pair, n] = silu(x . gate_e[n]) * (x . up_e[n]) for a block of pairs and BN rows of each half.

    SPLIT: program axis 2 covers K_SPLIT of K; float32 partial gate sums go to h[slice, pair, n] and up
    sums to h[slice, pair, L + n] (silu waits for the complete sums). PREFETCH: the next chunk's loads
    are issued before this chunk's decode and MMAs (Triton's pipeliner leaves these loads alone).
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    pair = tl.load(pairs_ptr + pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    valid = pair < num_pairs
    tok = pair // topk
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < L
    x_ptrs = x_ptr + tok[None, :] * s_xt + tl.arange(0, 32)[:, None]
    x_ok = valid[None, :]
    if SWAP:
        acc_g = tl.zeros((BN, BM), dtype=tl.float32)
        acc_u = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    if SPLIT:
        k_lo = tl.program_id(2) * K_SPLIT
        k_hi = tl.minimum(k_lo + K_SPLIT, K)
    else:
        k_lo = 0
        k_hi = K
    if DESC:  # w_ptr / s_ptr are descriptors over [rows, 32] bytes / [rows / 8, 16] scale bytes
        g_row = (expert * (s_we // 32)).to(tl.int32) + pid_n * BN
    else:
        g_e = w_ptr + expert * s_we
        u_e = g_e + L * 32
        gs_e = s_ptr + expert * s_se
        us_e = gs_e + L * 2
    if PREFETCH:
        if not DESC:
            ng, ngl, ngh = _load_w(g_e + (k_lo // 64) * s_wc, gs_e + (k_lo // 64) * s_sc, rn, n_ok)
            nu, nul, nuh = _load_w(u_e + (k_lo // 64) * s_wc, us_e + (k_lo // 64) * s_sc, rn, n_ok)
        nxl, nxh = _load_x(x_ptrs, x_ok, k_lo, K)
    for kc in range(k_lo, k_hi, 64):
        if PREFETCH:
            xl, xh = nxl, nxh
            kn = kc + 64
            nxl, nxh = _load_x(x_ptrs, (pair < tl.where(kn < k_hi, num_pairs, 0))[None, :], kn, K)
            if not DESC:
                pg, sgl, sgh, pu, sul, suh = ng, ngl, ngh, nu, nul, nuh
                more = rn < tl.where(kn < k_hi, L, 0)  # (the interpreter rejects a scalar & vector mask)
                ng, ngl, ngh = _load_w(g_e + (kn // 64) * s_wc, gs_e + (kn // 64) * s_sc, rn, more)
                nu, nul, nuh = _load_w(u_e + (kn // 64) * s_wc, us_e + (kn // 64) * s_sc, rn, more)
        else:
            xl, xh = _load_x(x_ptrs, x_ok, kc, K)
            if not DESC:
                pg, sgl, sgh = _load_w(g_e + (kc // 64) * s_wc, gs_e + (kc // 64) * s_sc, rn, n_ok)
                pu, sul, suh = _load_w(u_e + (kc // 64) * s_wc, us_e + (kc // 64) * s_sc, rn, n_ok)
        if DESC:
            row = g_row + (kc // 64) * (s_wc // 32)
            pg, sgl, sgh = _load_w_desc(w_ptr, s_ptr, row, BN)
            pu, sul, suh = _load_w_desc(w_ptr, s_ptr, row + L, BN)
        acc_g = _mma_chunk(acc_g, pg, sgl, sgh, xl, xh, SWAP, INTERPRET, ASM, BN, WORDS)
        acc_u = _mma_chunk(acc_u, pu, sul, suh, xl, xh, SWAP, INTERPRET, ASM, BN, WORDS)
    if not SWAP:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    mask = n_ok[:, None] & valid[None, :]
    if SPLIT:
        dst = h_ptr + tl.program_id(2) * s_hs + pair[None, :] * s_hp + rn[:, None]
        tl.store(dst, acc_g, mask=mask)
        tl.store(dst + L, acc_u, mask=mask)
    else:
        h = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(h_ptr + pair[None, :] * s_hp + rn[:, None], h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_pairs"])
def _fast_down(
    h_ptr, w_ptr, s_ptr, y_ptr, pairs_ptr, block_experts_ptr, route_w_ptr,
    num_pairs, N, K, K_SPLIT,
    s_hp, s_we, s_wc, s_se, s_sc, s_yp, s_ys,
    SWAP: tl.constexpr, INTERPRET: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr, PREFETCH: tl.constexpr,
    DESC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WORDS: tl.constexpr,
):
    """y[pair, n] = route_w[pair] * (h[pair] . down_e[n]) in float32 (SPLIT: partials in y[slice])."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    pair = tl.load(pairs_ptr + pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    valid = pair < num_pairs
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    h_ptrs = h_ptr + pair[None, :] * s_hp + tl.arange(0, 32)[:, None]
    h_ok = valid[None, :]
    if SWAP:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    if SPLIT:
        k_lo = tl.program_id(2) * K_SPLIT
        k_hi = tl.minimum(k_lo + K_SPLIT, K)
        y_ptr += tl.program_id(2) * s_ys
    else:
        k_lo = 0
        k_hi = K
    if DESC:
        w_row = (expert * (s_we // 32)).to(tl.int32) + pid_n * BN
    else:
        w_e = w_ptr + expert * s_we
        s_e = s_ptr + expert * s_se
    if PREFETCH:
        if not DESC:
            nw, nsl, nsh = _load_w(w_e + (k_lo // 64) * s_wc, s_e + (k_lo // 64) * s_sc, rn, n_ok)
        nhl, nhh = _load_x(h_ptrs, h_ok, k_lo, K)
    for kc in range(k_lo, k_hi, 64):
        if PREFETCH:
            hl, hh = nhl, nhh
            kn = kc + 64
            nhl, nhh = _load_x(h_ptrs, (pair < tl.where(kn < k_hi, num_pairs, 0))[None, :], kn, K)
            if not DESC:
                pw, sl, sh = nw, nsl, nsh
                nw, nsl, nsh = _load_w(w_e + (kn // 64) * s_wc, s_e + (kn // 64) * s_sc, rn,
                                       rn < tl.where(kn < k_hi, N, 0))
        else:
            hl, hh = _load_x(h_ptrs, h_ok, kc, K)
            if not DESC:
                pw, sl, sh = _load_w(w_e + (kc // 64) * s_wc, s_e + (kc // 64) * s_sc, rn, n_ok)
        if DESC:
            pw, sl, sh = _load_w_desc(w_ptr, s_ptr, w_row + (kc // 64) * (s_wc // 32), BN)
        acc = _mma_chunk(acc, pw, sl, sh, hl, hh, SWAP, INTERPRET, ASM, BN, WORDS)
    if not SWAP:
        acc = tl.trans(acc)
    rw = tl.load(route_w_ptr + pair, mask=valid, other=0.0)
    acc = acc * rw[None, :]
    tl.store(y_ptr + pair[None, :] * s_yp + rn[:, None], acc, mask=n_ok[:, None] & valid[None, :])


@dataclass(frozen=True)
class FastConfig:
    """Tiles of one fused_moe_fast call: block_m pairs per block, block_n weight rows per program."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    swap: bool
    asm: bool = True  # the packed PTX decode on a GPU (False: the per-element Triton form)
    prefetch: bool = True  # the next 64-wide chunk's register loads in flight during this one's math
    desc: bool = False  # weights and scales through tensor descriptors (TMA), pipelined num_stages deep


# Per-shape dispatch on pairs per expert (T * k / E), from bench/engine_moe_gpu_bench.py on an H200
# (E=384, H=7168, L=2048, A4W4, CUDA-graph replays; bench/results/2026-12-01_h200_moe3 and _moe4); the
# figures are the default word layout's, the nibble layout's in brackets (same run):
# - decode: 16 tokens per block on the MMA's narrow side, 128 weight rows (two 64-row wgmma tiles of one
#   warp group) on its wide side, weights and scales through descriptors 4 stages deep, activations
#   prefetched a chunk ahead: 0.312 / 1.490 / 2.909 ms at 4 / 32 / 128 tokens, 1.8x / 1.5x / 1.45x the
#   byte floor (0.335 / 1.723 / 3.364). 3 stages within 1.5%, 256 rows (fewer instructions per value,
#   but twice the registers) 5-6% slower, 8 warps on 256 rows 14-19% slower, 32-token blocks 26-43%
#   slower, no prefetch 70-76% slower; with nibbles: pointer loads on 64 rows 10-20% slower, the
#   per-element decode about 50% slower, one K=64 MMA on token-major activation loads 3-6% slower and
#   4.8x slower at 8192 tokens (moe3; moe4 first call).
# - in between (16-128 pairs per expert): 32-token blocks, 4.52 ms at 1024 tokens (4.76) against 6.47
#   for the decode tiles (first call, K=64 word variant).
# - prefill (8192 tokens): 64 tokens x 128 rows, 8 warps, descriptors, no register prefetch: 19.4 ms,
#   298 TFLOP/s (20.3) against 32.5 for tl.dot_scaled.
DECODE_CONFIG = FastConfig(block_m=16, block_n=128, num_warps=4, num_stages=4, swap=True, prefetch=True, desc=True)
BATCHED_CONFIG = FastConfig(block_m=32, block_n=128, num_warps=4, num_stages=4, swap=True, prefetch=True, desc=True)
PREFILL_CONFIG = FastConfig(block_m=64, block_n=128, num_warps=8, num_stages=4, swap=True, prefetch=False, desc=True)
PREFILL_PAIRS_PER_EXPERT = 128


def fast_config(num_pairs: int, num_experts: int) -> FastConfig:
    per_expert = num_pairs / max(1, num_experts)
    if per_expert >= PREFILL_PAIRS_PER_EXPERT:
        return PREFILL_CONFIG
    return DECODE_CONFIG if per_expert <= 16 else BATCHED_CONFIG


def _descriptors(experts: FastExperts, block_n: int) -> tuple[TensorDescriptor, ...]:
    """Tensor descriptors of the fast layout's four stacks: weight bytes as [rows, 32] (a tile is block_n
    rows of one chunk) and scales as [rows / 8, 16] (a tile's block_n pairs are block_n / 8 such rows)."""
    if block_n % 8 or experts.inter % 8 or experts.hidden % 8:
        raise ValueError(f"descriptor loads need block_n, inter and hidden divisible by 8; got {block_n}, "
                         f"{experts.inter}, {experts.hidden}")
    out = []
    for w, s in ((experts.w13, experts.s13), (experts.w2, experts.s2)):
        if experts.words:  # the same bytes as [rows, 8] int32 words
            out.append(TensorDescriptor.from_tensor(w.view(torch.int32).view(-1, 8), [block_n, 8]))
        else:
            out.append(TensorDescriptor.from_tensor(w.view(-1, 32), [block_n, 32]))
        out.append(TensorDescriptor.from_tensor(s.view(-1, 16), [block_n // 8, 16]))
    return tuple(out)


def fused_moe_fast(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: FastExperts,
    *,
    a4w4: bool = False,
    config: FastConfig | None = None,
    split_k: int = 1,
    down_split_k: int | None = None,
    add: torch.Tensor | None = None,
    x_quantized: bool = False,
) -> torch.Tensor:
    """out[t] = sum_j topk_weights[t, j] * down_j(silu(gate_j(x_t)) * up_j(x_t)), in x's dtype (+ `add`
    [T, H], e.g. the shared experts' output, rounded as `out + add`). x_quantized: x already holds its
    A4W4 values (`rms_norm(quantize=True)`), so it is not quantised again.

    Same numerics as triton_moe.fused_moe_mxfp4 (bf16 or fake-quantised MXFP4 activations, exact weights,
    float32 accumulation, deterministic); config None picks tiles by `fast_config`. split_k /
    down_split_k: K slices of the gate/up and down GEMMs (float32 partials added after).
    """
    hidden, inter = experts.hidden, experts.inter
    if x.dim() != 2 or x.shape[1] != hidden or topk_ids.dim() != 2 or topk_ids.shape != topk_weights.shape \
            or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"x [T, {hidden}], topk_ids and topk_weights [T, k] expected; got {tuple(x.shape)}, "
                         f"{tuple(topk_ids.shape)}, {tuple(topk_weights.shape)}")
    for name, val in (("split_k", split_k), ("down_split_k", down_split_k)):
        if val is not None and val < 1:
            raise ValueError(f"{name} must be >= 1, got {val}")
    tokens, topk = topk_ids.shape
    pairs = tokens * topk
    if pairs == 0:
        return torch.zeros_like(x) if add is None else add.to(x.dtype, copy=True)
    num_experts = experts.w13.shape[0]
    cfg = config or fast_config(pairs, num_experts)
    split1, ksplit1 = split_sizes(hidden, CHUNK, split_k)
    split2, ksplit2 = split_sizes(inter, CHUNK, down_split_k or split_k)
    align = moe_align(topk_ids, num_experts, cfg.block_m)
    num_blocks = align.block_experts.numel()
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    w13, s13, w2, s2 = experts.w13, experts.s13, experts.w2, experts.s2
    if experts.words and not (cfg.swap and cfg.desc):
        raise ValueError("word-packed experts need swapped tiles on tensor descriptors (swap=True, desc=True)")
    if cfg.desc:
        w13, s13, w2, s2 = _descriptors(experts, cfg.block_n)

    # x_quantized: x already holds A4W4's values (the norm before quantised it), bf16 holds them exactly
    xa = fake_quantize(x, torch.bfloat16) if a4w4 and not x_quantized else x.to(torch.bfloat16).contiguous()
    if split1 > 1:
        h_buf = torch.empty(split1, pairs, 2 * inter, dtype=torch.float32, device=x.device)
        s_hp, s_hs = h_buf.stride(1), h_buf.stride(0)
    else:
        # A4W4 keeps h in float32 until the bridge quantises it; so does the interpreter, whose bf16 cast
        # truncates (the bridge rounds)
        h_buf = torch.empty(pairs, inter, dtype=torch.float32 if a4w4 or interpret else torch.bfloat16,
                            device=x.device)
        s_hp, s_hs = h_buf.stride(0), 0
    _fast_gate_up[(num_blocks, triton.cdiv(inter, cfg.block_n), split1)](
        xa, w13, s13, h_buf, align.sorted_pairs, align.block_experts,
        pairs, topk, inter, hidden, ksplit1,
        xa.stride(0), *experts.w13.stride()[:2], *experts.s13.stride()[:2], s_hp, s_hs,
        SWAP=cfg.swap, INTERPRET=interpret, SPLIT=split1 > 1, ASM=cfg.asm, PREFETCH=cfg.prefetch, DESC=cfg.desc,
        BM=cfg.block_m, BN=cfg.block_n, WORDS=experts.words, **launch,
    )
    h = h_buf if h_buf.dtype == torch.bfloat16 else moe_bridge(h_buf, inter, act=split1 > 1, a4w4=a4w4)
    route_w = topk_weights.reshape(-1).to(torch.float32).contiguous()
    y = torch.empty(split2, pairs, hidden, dtype=torch.float32, device=x.device)
    _fast_down[(num_blocks, triton.cdiv(hidden, cfg.block_n), split2)](
        h, w2, s2, y, align.sorted_pairs, align.block_experts, route_w,
        pairs, hidden, inter, ksplit2,
        h.stride(0), *experts.w2.stride()[:2], *experts.s2.stride()[:2], y.stride(1), y.stride(0),
        SWAP=cfg.swap, INTERPRET=interpret, SPLIT=split2 > 1, ASM=cfg.asm, PREFETCH=cfg.prefetch, DESC=cfg.desc,
        BM=cfg.block_m, BN=cfg.block_n, WORDS=experts.words, **launch,
    )
    return moe_combine(y, topk, x.dtype, add)
