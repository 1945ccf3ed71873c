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
def _piece(t, IDX: tl.constexpr, N: tl.constexpr):
    """t[IDX] of a [N, A, B] tensor (N = 1 or 2) as [A, B], by permute / reshape / split only, which Triton
    maps onto registers the thread already holds."""
    if N == 1:
        out = tl.reshape(t, (t.shape[1], t.shape[2]))
    else:
        lo, hi = tl.split(tl.permute(t, (1, 2, 0)))
        out = hi if IDX else lo
    return out


@triton.jit
def _load_w(w_desc, s_desc, chunk, row, BN: tl.constexpr, CPI: tl.constexpr):
    """CPI consecutive 64-wide K chunks of BN weight rows in one copy each for words and scales: words
    [CPI, BN, 8] and E8M0 codes [CPI, BN, 2] (the row's two groups per chunk). chunk: the first chunk's index
    in the [E * chunks, rows, 8] word view; row: the tile's first row. A chunk's BN scale pairs are BN * 2
    contiguous bytes, read as [BN / 8, 16] (a copy's row must span 16 bytes)."""
    p = w_desc.load([chunk, row, 0])
    s = tl.reshape(s_desc.load([chunk, row // 8, 0]), (CPI, BN, 2))
    return p, s


@triton.jit
def _load_x(x_ptrs, valid, kc, k_hi, CPI: tl.constexpr):
    """The block's activations at k = kc .. kc + 64 CPI - 1 as a tuple of 2 CPI [32, BM] pieces (2i + h:
    chunk i's values 32h..32h+31), zero for slots not valid and from k_hi on (so a step that reaches past
    its K slice adds nothing there); x_ptrs: [32, BM] pointers at k = 0. Separate loads, not one split
    tensor: a split of loaded values costs a register layout conversion (sm_90 TTGIR)."""
    rk = tl.arange(0, 32)[:, None]
    x = ()
    for j in tl.static_range(2 * CPI):
        k = kc + 32 * j
        x = x + (tl.load(x_ptrs + k, mask=valid[None, :] & (k + rk < k_hi), other=0.0),)
    return x


@triton.jit
def _mma_chunk(acc, p, s, x_lo, x_hi, INTERPRET: tl.constexpr, BN: tl.constexpr):
    """acc [BN, BM] += W_chunk . x_chunk: the decoded weights (words p [BN, 8], codes s [BN, 2]) as the MMA's
    A operand, two K=32 MMAs."""
    s_lo, s_hi = tl.split(s)
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
def _mma_step(acc, p, s, x, INTERPRET: tl.constexpr, BN: tl.constexpr, CPI: tl.constexpr):
    """acc += the CPI chunks of one step in K order (the same sums, in the same order, as one chunk a step)."""
    for i in tl.static_range(CPI):
        acc = _mma_chunk(acc, _piece(p, i, CPI), _piece(s, i, CPI), x[2 * i], x[2 * i + 1], INTERPRET, BN)
    return acc


@triton.jit
def _x_ahead(x_ptrs, valid, k_lo, k_hi, PREFETCH: tl.constexpr, CPI: tl.constexpr):
    """What a K loop carries into its first step: with PREFETCH that step's activations, else `valid` as a
    placeholder that `_k_step` hands back untouched (an unchanged loop value, which compiles away)."""
    if PREFETCH:
        return _load_x(x_ptrs, valid, k_lo, k_hi, CPI)
    else:
        return valid


@triton.jit
def _k_step(acc_a, acc_b, x_next, x_ptrs, valid, kc, k_hi, w_desc, s_desc, chunk, row, b_off,
            INTERPRET: tl.constexpr, PREFETCH: tl.constexpr, TWO: tl.constexpr, BN: tl.constexpr,
            CPI: tl.constexpr):
    """One step of a K loop at kc: CPI 64-wide chunks (the loop itself stays in the kernel, where the
    pipeliner sees these descriptor loads). The activations (PREFETCH: x_next, loaded a step before,
    while the next step's, none from k_hi on, are loaded now; else loaded here), the weight chunks at
    (chunk, row) and, with TWO, a second stream at row + b_off sharing the activations (gate/up's up rows),
    then acc_a's MMAs and acc_b's. Returns the accumulators and what to carry into the next step."""
    if PREFETCH:
        x = x_next
        x_next = _load_x(x_ptrs, valid, kc + 64 * CPI, k_hi, CPI)
    else:
        x = _load_x(x_ptrs, valid, kc, k_hi, CPI)
    pa, sa = _load_w(w_desc, s_desc, chunk, row, BN, CPI)
    if TWO:
        pb, sb = _load_w(w_desc, s_desc, chunk, row + b_off, BN, CPI)
    acc_a = _mma_step(acc_a, pa, sa, x, INTERPRET, BN, CPI)
    if TWO:
        acc_b = _mma_step(acc_b, pb, sb, x, INTERPRET, BN, CPI)
    return acc_a, acc_b, x_next


@triton.jit(do_not_specialize=["num_pairs"])  # one compiled kernel for every batch size (triton_moe_glue)
def _fast_gate_up(
    x_ptr, w_desc, s_desc, h_ptr, pairs_ptr, block_experts_ptr,
    num_pairs, topk, L, K, K_SPLIT, s_xt, chunks, s_hp, s_hs,
    INTERPRET: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    CPI: tl.constexpr,
):
    """h[pair, n] = silu(x . gate_e[n]) * (x . up_e[n]) for a block of pairs and BN rows of each half
    (SPLIT: float32 partials, `store_gate_up`). chunks: 64-wide K chunks per expert. CPI: chunks per K
    step (one copy each). PREFETCH: the next step's activations are loaded before this step's MMAs."""
    expert = tl.load(block_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert < 0:  # a block past the last expert's group
        return
    pair, valid, rn = block_pairs(pairs_ptr, num_pairs, BM, BN)
    tok = pair // topk
    x_ptrs = x_ptr + tok[None, :] * s_xt + tl.arange(0, 32)[:, None]
    acc_g = tl.zeros((BN, BM), dtype=tl.float32)
    acc_u = tl.zeros((BN, BM), dtype=tl.float32)
    k_lo, k_hi = k_range(K, K_SPLIT, SPLIT)
    c0 = (expert * chunks).to(tl.int32)
    row = tl.program_id(1) * BN
    x_next = _x_ahead(x_ptrs, valid, k_lo, k_hi, PREFETCH, CPI)
    for kc in range(k_lo, k_hi, 64 * CPI):
        acc_g, acc_u, x_next = _k_step(acc_g, acc_u, x_next, x_ptrs, valid, kc, k_hi, w_desc, s_desc,
                                       c0 + kc // 64, row, L, INTERPRET, PREFETCH, True, BN, CPI)
    store_gate_up(h_ptr, pair[None, :] * s_hp + rn[:, None], acc_g, acc_u, (rn < L)[:, None] & valid[None, :], L,
                  s_hs, SPLIT)


@triton.jit(do_not_specialize=["num_pairs"])
def _fast_down(
    h_ptr, w_desc, s_desc, y_ptr, pairs_ptr, block_experts_ptr, route_w_ptr,
    num_pairs, N, K, K_SPLIT, s_hp, chunks, s_yp, s_ys,
    INTERPRET: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    CPI: tl.constexpr,
):
    """y[pair, n] = route_w[pair] * (h[pair] . down_e[n]) in float32 (SPLIT: partials in y[slice])."""
    expert = tl.load(block_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert < 0:  # a block past the last expert's group
        return
    pair, valid, rn = block_pairs(pairs_ptr, num_pairs, BM, BN)
    h_ptrs = h_ptr + pair[None, :] * s_hp + tl.arange(0, 32)[:, None]
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    k_lo, k_hi = k_range(K, K_SPLIT, SPLIT)
    if SPLIT:
        y_ptr += tl.program_id(2) * s_ys
    c0 = (expert * chunks).to(tl.int32)
    row = tl.program_id(1) * BN
    h_next = _x_ahead(h_ptrs, valid, k_lo, k_hi, PREFETCH, CPI)
    for kc in range(k_lo, k_hi, 64 * CPI):
        acc, _, h_next = _k_step(acc, acc, h_next, h_ptrs, valid, kc, k_hi, w_desc, s_desc, c0 + kc // 64, row,
                                 0, INTERPRET, PREFETCH, False, BN, CPI)
    rw = tl.load(route_w_ptr + pair, mask=valid, other=0.0)
    acc = acc * rw[None, :]
    tl.store(y_ptr + pair[None, :] * s_yp + rn[:, None], acc, mask=(rn < N)[:, None] & valid[None, :])


def _descriptors(w: torch.Tensor, s: torch.Tensor, block_n: int, cpi: int) -> tuple[TensorDescriptor, ...]:
    """Tensor descriptors of one GEMM's stacks, as [E * chunks, rows, ...] so that one copy brings cpi
    consecutive chunks of a tile: words [E * chunks, rows, 8] int32 (box cpi x block_n x 8) and scales
    [E * chunks, rows / 8, 16] bytes (box cpi x block_n / 8 x 16). A box that runs past an expert's last
    chunk reads the next expert's first (or zeros past the stack), which the zero activations there cancel."""
    e, chunks, rows = w.shape[:3]
    return (TensorDescriptor.from_tensor(w.view(torch.int32).view(e * chunks, rows, 8), [cpi, block_n, 8]),
            TensorDescriptor.from_tensor(s.view(e * chunks, rows // 8, 16), [cpi, block_n // 8, 16]))


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
    if cfg.block_n % 8 or inter % 8 or hidden % 8:  # a tile's scales (and the up rows') start on a 16-byte row
        raise ValueError(f"descriptor loads need block_n, inter and hidden divisible by 8; got {cfg.block_n}, "
                         f"{inter}, {hidden}")
    c13, c2 = cfg.step_chunks()
    w13, s13 = _descriptors(experts.w13, experts.s13, cfg.block_n, c13)
    w2, s2 = _descriptors(experts.w2, experts.s2, cfg.block_n, c2)

    def gemm(kernel, descriptors, words, cpi):  # K slices hold whole steps of cpi chunks
        meta = {"INTERPRET": interpreting(), "PREFETCH": cfg.prefetch, "CPI": cpi, "num_warps": cfg.num_warps,
                "num_stages": cfg.num_stages}
        return MoeGemm(kernel, descriptors, (words.shape[1],), cfg.block_n, CHUNK * cpi, meta)

    return run_moe(x, topk_ids, topk_weights, num_experts=num_experts, hidden=hidden, inter=inter,
                   block_m=cfg.block_m, splits=lambda _blocks: (split_k, down_split_k or split_k), a4w4=a4w4,
                   x_quantized=x_quantized, add=add, gate_up=gemm(_fast_gate_up, (w13, s13), experts.w13, c13),
                   down=gemm(_fast_down, (w2, s2), experts.w2, c2))
