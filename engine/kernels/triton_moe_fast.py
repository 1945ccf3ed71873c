"""Fused routed-expert MoE on the load-time word layout (`moe_fast_layout`): E2M1 decoded straight into the
wgmma register operand (the Hopper family; which family runs where: `moe_dispatch`).

Why: on GPUs without FP4 units `tl.dot_scaled` decodes every element through an upcast, a scale broadcast,
a multiply, a NaN select and a layout conversion (bench/results/2026-11-30_h200_engine). Here a 64-wide K
chunk of a weight row is eight 32-bit words, each holding the eight values of one scale group that one
thread's A fragment needs; a tile comes in as [BN, 8] int32 (one 8-byte shared-memory load gives a thread
both of its words) and each bf16x2 register of the operand is one to three integer ops and a multiply by
the bf16 scale 2^(e-1) (`words_to_operand`, inline PTX on the GPU). The eight outputs are assembled into
the chunk's two [BN, 32] halves by join / permute / reshape / split only, which Triton maps back onto the
load's register layout, so no value moves between threads or through shared memory (checked in the sm_90
TTGIR: the local_load of the words feeds the warp_group_dot with no convert_layout).

The GEMMs put expert weight rows on the MMA's M side (64 rows per wgmma tile, decoded in registers, the
wgmma A operand) and the block's tokens on the N side. Weights and scales come through tensor descriptors
(TMA on Hopper): Triton's pipeliner keeps `num_stages` chunks in flight in shared memory and reads them
straight into the operand layout; the activations can be loaded a chunk ahead in registers (`prefetch`).
Pairs are sorted and padded per expert, and the h / y buffers, bridge and combine are the shared glue
(`triton_moe_glue.run_moe`); split-K writes float32 partials that the bridge and the combine add, the k
experts of a token in a fixed order (an epilogue reduce across programs would need atomics, whose order,
and so whose float32 result, changes from run to run).

Under TRITON_INTERPRET=1 (no inline asm; bf16 arithmetic on raw bits) the same bits are decoded in
float32. The GPU decode is checked against the OCP table by tests/engine/kernels/test_triton_moe_fast.py
on a GPU. Not run on ROCm: the PTX is CUDA-only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from k2bench.engine.kernels.moe_dispatch import FastTiles, fast_tiles
from k2bench.engine.kernels.moe_fast_layout import CHUNK, FastExperts
from k2bench.engine.kernels.triton_moe_glue import (
    MoeGemm,
    block_pairs,
    check_split,
    interpreting,
    k_range,
    run_moe,
    store_gate_up,
)

# Per word: pairs 0..3 (j = 2s + c) as bf16x2 bits times the scale; $8 the word, $9 the bf16 scale.
_WORDS_PTX = tl.constexpr("""{
.reg .b32 t, s;
mov.b32 s, {$9, $9};
shl.b32 t, $8, 6;
and.b32 t, t, 0x81C081C0;
mul.rn.bf16x2 t, t, s;
mov.b32 {$0, $1}, t;
and.b32 t, $8, 0x40384038;
mul.lo.u32 t, t, 18;
and.b32 t, t, 0x81C081C0;
mul.rn.bf16x2 t, t, s;
mov.b32 {$2, $3}, t;
and.b32 t, $8, 0x81C081C0;
mul.rn.bf16x2 t, t, s;
mov.b32 {$4, $5}, t;
shr.b32 t, $8, 10;
and.b32 t, t, 0x000F000F;
mul.lo.u32 t, t, 0x8020;
and.b32 t, t, 0x81C081C0;
mul.rn.bf16x2 t, t, s;
mov.b32 {$6, $7}, t;
}""")


@triton.jit
def _pair_bits(w, J: tl.constexpr):
    """Pair J of each word as bf16x2 bits (sign << 15 | magnitude << 6 per half), in Triton integer ops."""
    if J == 0:
        t = (w << 6) & 0x81C081C0
    elif J == 1:
        t = ((w & 0x40384038) * 18) & 0x81C081C0
    elif J == 2:
        t = w & 0x81C081C0
    else:
        t = (((w >> 10) & 0x000F000F) * 0x8020) & 0x81C081C0
    return t.to(tl.uint32)


@triton.jit
def _half(t, HIGH: tl.constexpr, sc, INTERPRET: tl.constexpr):
    """One 16-bit half of bf16x2 bits times the scale 2^(e-1): float32 under the interpreter, else bf16."""
    bits = (t >> 16) if HIGH else (t & 0xFFFF)
    if INTERPRET:
        return (bits << 16).to(tl.float32, bitcast=True) * sc
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True) * sc


@triton.jit
def words_to_operand(w, e, BN: tl.constexpr, INTERPRET: tl.constexpr):
    """Words [BN, 8] (int32, word 2q + h) and E8M0 codes [BN, 8] (each word's group) -> the chunk's two
    scale groups' values [BN, 32] each, in k order (bf16; float32 under the interpreter). On a GPU the
    inline-PTX decode; under the interpreter (no inline asm) the same bit programs in Triton integer ops."""
    if INTERPRET:
        sc = ((e.to(tl.uint32) + 126) << 23).to(tl.float32, bitcast=True)
    else:
        sc = ((e.to(tl.uint16) + 126) << 7).to(tl.bfloat16, bitcast=True)
    if not INTERPRET:
        a0, a1, b0, b1, c0, c1, d0, d1 = tl.inline_asm_elementwise(
            _WORDS_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, sc], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        wu = w.to(tl.uint32, bitcast=True)
        t0 = _pair_bits(wu, 0)
        t1 = _pair_bits(wu, 1)
        t2 = _pair_bits(wu, 2)
        t3 = _pair_bits(wu, 3)
        a0, a1 = _half(t0, False, sc, INTERPRET), _half(t0, True, sc, INTERPRET)
        b0, b1 = _half(t1, False, sc, INTERPRET), _half(t1, True, sc, INTERPRET)
        c0, c1 = _half(t2, False, sc, INTERPRET), _half(t2, True, sc, INTERPRET)
        d0, d1 = _half(t3, False, sc, INTERPRET), _half(t3, True, sc, INTERPRET)
    v = tl.join(tl.join(tl.join(a0, a1), tl.join(b0, b1)), tl.join(tl.join(c0, c1), tl.join(d0, d1)))
    v = tl.reshape(v, (BN, 4, 2, 2, 2, 2))  # [row, q, h, l, c, s]
    v = tl.reshape(tl.permute(v, (0, 5, 4, 1, 3, 2)), (BN, 32, 2))  # [row, 16s + 8c + 2q + l, h]
    return tl.split(v)


@triton.jit
def word_scales(s_lo, s_hi, BN: tl.constexpr):
    """The E8M0 code of each word [BN, 8] (word 2q + h takes group h) from the rows' two codes [BN]."""
    s = tl.join(s_lo, s_hi)  # [BN, 2]
    return tl.reshape(tl.broadcast_to(s[:, None, :], (BN, 4, 2)), (BN, 8))


@triton.jit
def _load_w(w_desc, s_desc, row, BN: tl.constexpr):
    """One 64-wide K chunk of BN weight rows through the descriptors: words [BN, 8] and the two scale codes
    [BN] of each row; row is the tile's first row in the [rows, 8] word view; its BN scale pairs are
    BN * 2 contiguous bytes, read as [BN / 8, 16] (a copy's row must span 16 bytes) and split."""
    p = w_desc.load([row, 0])
    s = tl.reshape(s_desc.load([row // 8, 0]), (BN, 2))
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
def _mma_chunk(acc, p, s_lo, s_hi, x_lo, x_hi, INTERPRET: tl.constexpr, BN: tl.constexpr):
    """acc [BN, BM] += W_chunk . x_chunk: the decoded weights as the MMA's A operand, two K=32 MMAs."""
    w_lo, w_hi = words_to_operand(p, word_scales(s_lo, s_hi, BN), BN, INTERPRET)
    if INTERPRET:  # the interpreter's tl.dot multiplies bf16 operands as raw bits
        x_lo = x_lo.to(tl.float32)
        x_hi = x_hi.to(tl.float32)
    else:
        x_lo = x_lo.to(tl.bfloat16)
        x_hi = x_hi.to(tl.bfloat16)
    acc = tl.dot(w_lo, x_lo, acc)
    return tl.dot(w_hi, x_hi, acc)


@triton.jit
def _x_ahead(x_ptrs, x_ok, k_lo, K, PREFETCH: tl.constexpr):
    """What a K loop carries into its first chunk: with PREFETCH that chunk's activations, else x_ok twice
    as placeholders that `_k_step` hands back untouched (an unchanged loop value, which compiles away)."""
    if PREFETCH:
        return _load_x(x_ptrs, x_ok, k_lo, K)
    else:
        return x_ok, x_ok


@triton.jit
def _k_step(acc_a, acc_b, x_lo, x_hi, x_ptrs, x_ok, pair, num_pairs, kc, k_hi, K, w_desc, s_desc, row, b_off,
            INTERPRET: tl.constexpr, PREFETCH: tl.constexpr, TWO: tl.constexpr, BN: tl.constexpr):
    """One 64-wide K chunk at kc of a K loop (the loop itself stays in the kernel, where the pipeliner sees
    these descriptor loads): the activations (PREFETCH: x_lo / x_hi, loaded a chunk before, while the next
    chunk's, none past k_hi, are loaded now; else loaded here), the weight chunk at `row` and, with TWO,
    a second stream at row + b_off sharing the activations (gate/up's up rows), then acc_a's MMAs and acc_b's.
    Returns the accumulators and what to carry into the next chunk (as `_x_ahead`)."""
    if PREFETCH:
        xl, xh = x_lo, x_hi
        kn = kc + 64
        x_lo, x_hi = _load_x(x_ptrs, (pair < tl.where(kn < k_hi, num_pairs, 0))[None, :], kn, K)
    else:
        xl, xh = _load_x(x_ptrs, x_ok, kc, K)
    pa, sal, sah = _load_w(w_desc, s_desc, row, BN)
    if TWO:
        pb, sbl, sbh = _load_w(w_desc, s_desc, row + b_off, BN)
    acc_a = _mma_chunk(acc_a, pa, sal, sah, xl, xh, INTERPRET, BN)
    if TWO:
        acc_b = _mma_chunk(acc_b, pb, sbl, sbh, xl, xh, INTERPRET, BN)
    return acc_a, acc_b, x_lo, x_hi


@triton.jit(do_not_specialize=["num_pairs"])  # one compiled kernel for every batch size (triton_moe_glue)
def _fast_gate_up(
    x_ptr, w_desc, s_desc, h_ptr, pairs_ptr, block_experts_ptr,
    num_pairs, topk, L, K, K_SPLIT, s_xt, rows_e, rows_c, s_hp, s_hs,
    INTERPRET: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):
    """h[pair, n] = silu(x . gate_e[n]) * (x . up_e[n]) for a block of pairs and BN rows of each half
    (SPLIT: float32 partials, `store_gate_up`). rows_e / rows_c: rows of the [rows, 8] word view per
    expert / per chunk. PREFETCH: the next chunk's activations are loaded before this chunk's MMAs."""
    expert = tl.load(block_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert < 0:  # a block past the last expert's group
        return
    pair, valid, rn = block_pairs(pairs_ptr, num_pairs, BM, BN)
    tok = pair // topk
    x_ptrs = x_ptr + tok[None, :] * s_xt + tl.arange(0, 32)[:, None]
    x_ok = valid[None, :]
    acc_g = tl.zeros((BN, BM), dtype=tl.float32)
    acc_u = tl.zeros((BN, BM), dtype=tl.float32)
    k_lo, k_hi = k_range(K, K_SPLIT, SPLIT)
    g_row = (expert * rows_e).to(tl.int32) + tl.program_id(1) * BN
    nxl, nxh = _x_ahead(x_ptrs, x_ok, k_lo, K, PREFETCH)
    for kc in range(k_lo, k_hi, 64):
        row = g_row + (kc // 64) * rows_c
        acc_g, acc_u, nxl, nxh = _k_step(acc_g, acc_u, nxl, nxh, x_ptrs, x_ok, pair, num_pairs, kc, k_hi, K,
                                         w_desc, s_desc, row, L, INTERPRET, PREFETCH, True, BN)
    store_gate_up(h_ptr, pair[None, :] * s_hp + rn[:, None], acc_g, acc_u, (rn < L)[:, None] & valid[None, :], L,
                  s_hs, SPLIT)


@triton.jit(do_not_specialize=["num_pairs"])
def _fast_down(
    h_ptr, w_desc, s_desc, y_ptr, pairs_ptr, block_experts_ptr, route_w_ptr,
    num_pairs, N, K, K_SPLIT, s_hp, rows_e, rows_c, s_yp, s_ys,
    INTERPRET: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):
    """y[pair, n] = route_w[pair] * (h[pair] . down_e[n]) in float32 (SPLIT: partials in y[slice])."""
    expert = tl.load(block_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert < 0:  # a block past the last expert's group
        return
    pair, valid, rn = block_pairs(pairs_ptr, num_pairs, BM, BN)
    h_ptrs = h_ptr + pair[None, :] * s_hp + tl.arange(0, 32)[:, None]
    h_ok = valid[None, :]
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    k_lo, k_hi = k_range(K, K_SPLIT, SPLIT)
    if SPLIT:
        y_ptr += tl.program_id(2) * s_ys
    w_row = (expert * rows_e).to(tl.int32) + tl.program_id(1) * BN
    nhl, nhh = _x_ahead(h_ptrs, h_ok, k_lo, K, PREFETCH)
    for kc in range(k_lo, k_hi, 64):
        row = w_row + (kc // 64) * rows_c
        acc, _, nhl, nhh = _k_step(acc, acc, nhl, nhh, h_ptrs, h_ok, pair, num_pairs, kc, k_hi, K,
                                   w_desc, s_desc, row, 0, INTERPRET, PREFETCH, False, BN)
    rw = tl.load(route_w_ptr + pair, mask=valid, other=0.0)
    acc = acc * rw[None, :]
    tl.store(y_ptr + pair[None, :] * s_yp + rn[:, None], acc, mask=(rn < N)[:, None] & valid[None, :])


def _descriptors(experts: FastExperts, block_n: int) -> tuple[TensorDescriptor, ...]:
    """Tensor descriptors of the layout's four stacks: words as [rows, 8] int32 (a tile is block_n rows of
    one chunk) and scales as [rows / 8, 16] bytes (a tile's block_n pairs are block_n / 8 such rows)."""
    if block_n % 8 or experts.inter % 8 or experts.hidden % 8:
        raise ValueError(f"descriptor loads need block_n, inter and hidden divisible by 8; got {block_n}, "
                         f"{experts.inter}, {experts.hidden}")
    out = []
    for w, s in ((experts.w13, experts.s13), (experts.w2, experts.s2)):
        out.append(TensorDescriptor.from_tensor(w.view(torch.int32).view(-1, 8), [block_n, 8]))
        out.append(TensorDescriptor.from_tensor(s.view(-1, 16), [block_n // 8, 16]))
    return tuple(out)


def fused_moe_fast(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: FastExperts,
    *,
    a4w4: bool = False,
    config: FastTiles | None = None,
    split_k: int = 1,
    down_split_k: int | None = None,
    add: torch.Tensor | None = None,
    x_quantized: bool = False,
) -> torch.Tensor:
    """`triton_moe.fused_moe_mxfp4` on the fast layout: the same result (x, topk_ids, topk_weights, a4w4,
    add and x_quantized as there) and numerics (bf16 or fake-quantised MXFP4 activations, exact weights,
    float32 accumulation, deterministic). config None picks tiles by `moe_dispatch.fast_tiles`. split_k /
    down_split_k: K slices of the gate/up and down GEMMs (float32 partials added after).
    """
    hidden, inter = experts.hidden, experts.inter
    check_split(split_k, down_split_k)
    num_experts = experts.w13.shape[0]
    cfg = config or fast_tiles(topk_ids.numel(), num_experts)
    w13, s13, w2, s2 = _descriptors(experts, cfg.block_n)
    meta = {"INTERPRET": interpreting(), "PREFETCH": cfg.prefetch, "num_warps": cfg.num_warps,
            "num_stages": cfg.num_stages}

    def gemm(kernel, descriptors, words):  # strides: rows of the [rows, 8] word view per expert / per chunk
        return MoeGemm(kernel, descriptors, (words.stride(0) // 32, words.stride(1) // 32), cfg.block_n, CHUNK, meta)

    return run_moe(x, topk_ids, topk_weights, num_experts=num_experts, hidden=hidden, inter=inter,
                   block_m=cfg.block_m, splits=lambda _blocks: (split_k, down_split_k or split_k), a4w4=a4w4,
                   x_quantized=x_quantized, add=add, gate_up=gemm(_fast_gate_up, (w13, s13), experts.w13),
                   down=gemm(_fast_down, (w2, s2), experts.w2))
