"""Fused routed-expert MoE for MXFP4 experts in Triton: each touched expert's packed weights read once per call.

Design (the same shape as the usual "align, then grouped GEMM" fused MoE):
1. `triton_moe_glue.moe_align` sorts the T*k (token, expert) pairs by expert on the device (two
   kernels) and lays them out in a buffer of static size, each expert's group padded to a multiple of
   BLOCK_M with a sentinel (= T*k), and gives every BLOCK_M block its expert id (-1 for blocks past
   the last group). Shapes depend only on (T, k, E, BLOCK_M): no host synchronisation, so a step can
   be captured in a CUDA graph.
2. `_moe_gate_up`: one program per (block of sorted pairs, tile of L columns). It gathers the
   block's token rows of x (bf16), streams the expert's packed gate rows and the matching up rows
   along K = H, dequantises them in registers (or hands them to `tl.dot_scaled`) and keeps two
   float32 accumulators; it writes silu(gate) * up per pair into h [T*k, L].
3. `_moe_down`: the same over H output columns with K = L, scaled by the pair's routing weight,
   written as float32 rows y [T*k, H] (each pair's row exactly once: deterministic).
4. `triton_moe_glue.moe_combine` sums y over the k experts of each token in float32 and casts once
   to x's dtype (one kernel).
5. Split-K (decode, few pairs: `moe_split_k`): each GEMM's K is cut into slices that run as extra
   programs on grid axis 2. Gate/up slices write float32 partial gate and up sums [slice, pair, 2L];
   the bridge kernel (`moe_bridge`) adds them and only then applies silu(gate) * up and the usual
   rounding of h. Down slices write weighted partial rows [slice, pair, H] that the combine adds with
   the k experts. Partials instead of atomics: the result stays deterministic; a split changes only
   the float32 summation order.

Numerics: activations enter each GEMM as bf16 (W4), or fake-quantised MXFP4 values, which bf16
holds exactly (A4W4: x before w13 by triton_quant.fake_quantize, h before w2 by the bridge; h is
kept in float32 until it is quantised). Weights are decoded exactly, except that in the "dequant"
variant a scale code of 0 decodes as 0 (|w| < 2^-124) and a GPU may flush products below 2^-126.
Accumulation is float32. Memory: h [T*k, L] (bf16, float32 in A4W4) and y [T*k, H] float32, e.g.
1.9 GB of y at T=8192, k=8, H=7168.

Under TRITON_INTERPRET=1 (triton 3.9 here) two interpreter defects are worked around: tl.dot on bf16
operands multiplies their raw bits (so operands are widened to float32 there, same products) and the
float32 -> bf16 cast truncates (so h is stored as float32 and rounded by the bridge there). The GPU path
(bf16 tl.dot, in-kernel round-to-nearest cast) is therefore not what the CPU tests execute.

Two ways to get the weights into the matmul (`variant=`): "dequant" unpacks the nibbles, decodes
E2M1 with integer ops, multiplies by the E8M0 scale and calls plain `tl.dot`; "dot_scaled" passes
the packed bytes and scales to `tl.dot_scaled` as triton_backend._mxfp4_gemm does. Both run on a
CUDA GPU or on CPU under TRITON_INTERPRET=1 (tests). Speed on a GPU is measured in bench/, not here.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from k2bench.engine.kernels.triton_moe_glue import moe_align, moe_bridge, moe_combine
from k2bench.engine.kernels.triton_quant import fake_quantize
from k2bench.engine.model.mxfp4 import BLOCK

VARIANTS = ("dequant", "dot_scaled")
# bench/engine_kernel_tune.py on an H200 (triton 3.6, TP 2 widths, A4W4): dot_scaled was 5-14% faster
# than the explicit dequantisation at 4, 128 and 8192 tokens with the default tiles.
DEFAULT_VARIANT = "dot_scaled"

# Split-K (decode): when a launch has too few programs to keep the GPU's memory pipes busy, K is cut
# into slices that run as separate programs, each writing float32 partial sums that are added after.
# Aim for ~8 programs per SM of an H200 (132 SMs) with at least MIN_SPLIT_TILES BK tiles per slice.
# Shape-only choices, so no host sync; tuned by bench/engine_kernel_tune.py, not by tests.
SPLIT_TARGET_PROGRAMS = 1056
MIN_SPLIT_TILES = 4


def auto_split_k(programs: int, k_tiles: int) -> int:
    """How many K slices a launch of `programs` programs, each over `k_tiles` BK tiles, should use."""
    if programs >= SPLIT_TARGET_PROGRAMS:
        return 1
    want = triton.cdiv(SPLIT_TARGET_PROGRAMS, max(1, programs))
    return max(1, min(want, k_tiles // MIN_SPLIT_TILES))


def split_sizes(k: int, bk: int, split_k: int) -> tuple[int, int]:
    """(slices, K per slice) for a requested split: whole BK tiles per slice, no empty slice (the last
    may be shorter, e.g. 7 tiles over 3 slices -> 3, 3, 1)."""
    tiles = triton.cdiv(k, bk)
    per = triton.cdiv(tiles, max(1, min(split_k, tiles)))
    return triton.cdiv(tiles, per), per * bk


@triton.jit
def _dequant_tile(packed, scale, BN: tl.constexpr, BK: tl.constexpr):
    """packed uint8 [BN, BK/2] (low nibble = lower K), E8M0 scale [BN, BK/32] -> bf16 [BN, BK] in K order."""
    p = packed.to(tl.int32)
    codes = tl.reshape(tl.join(p & 15, p >> 4), (BN, BK))  # interleave back: k = 2i (low), 2i + 1 (high)
    m = codes & 7
    # magnitude 1, 1.5, 2, 3, 4, 6 (m >= 2) as float32 bits: exponent e = m >> 1 biased by 126,
    # top mantissa bit = m & 1, i.e. (m << 22) + (126 << 23); m == 1 is 0.5 and m == 0 is 0.
    bits = tl.where(m >= 2, (m << 22) + (126 << 23), tl.where(m == 1, 126 << 23, 0))
    bits = bits | ((codes & 8) << 28)  # sign
    vals = bits.to(tl.float32, bitcast=True)
    s = scale.to(tl.int32)
    sf = (s << 23).to(tl.float32, bitcast=True)  # 2^(s - 127) for s in 1..254; s == 0 -> 0
    sf = tl.where(s == 255, float("nan"), sf)
    w = tl.reshape(vals, (BN, BK // 32, 32)) * tl.reshape(sf, (BN, BK // 32, 1))
    return tl.reshape(w, (BN, BK)).to(tl.bfloat16)


@triton.jit
def _weight_dot(acc, a, w_rows, ws_rows, n_ok, k0, s_wk, s_wsk, DOT_SCALED: tl.constexpr,
                INTERPRET: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """acc [BM, BN] += a [BM, BK] @ W[rows, k0:k0+BK]^T for one expert's MXFP4 rows (row pointers given).

    INTERPRET: the CPU interpreter (triton 3.9) multiplies bf16 operands of tl.dot as their raw
    uint16 bits, so there they are widened to float32 first; the products are the same (bf16 x bf16
    is exact in float32), only the operand type differs from the GPU path.
    """
    rks = k0 // 32 + tl.arange(0, BK // 32)
    w_s = tl.load(ws_rows[:, None] + rks[None, :] * s_wsk, mask=n_ok[:, None], other=127)
    if DOT_SCALED:
        rk2 = k0 // 2 + tl.arange(0, BK // 2)
        w = tl.load(w_rows[None, :] + rk2[:, None] * s_wk, mask=n_ok[None, :], other=0)  # [BK/2, BN]
        acc = tl.dot_scaled(a, None, "bf16", w, w_s, "e2m1", acc)
    else:
        rk2 = k0 // 2 + tl.arange(0, BK // 2)
        w = tl.load(w_rows[:, None] + rk2[None, :] * s_wk, mask=n_ok[:, None], other=0)  # [BN, BK/2]
        wt = tl.trans(_dequant_tile(w, w_s, BN, BK))
        if INTERPRET:
            acc = tl.dot(a.to(tl.float32), wt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, wt, acc)
    return acc


@triton.jit
def _moe_gate_up(
    x_ptr, w_ptr, ws_ptr, h_ptr, pairs_ptr, block_experts_ptr,
    num_pairs, topk, L, K, K_SPLIT,
    s_xt, s_xk, s_we, s_wn, s_wk, s_wse, s_wsn, s_wsk, s_hp, s_hn, s_hs,
    DOT_SCALED: tl.constexpr, INTERPRET: tl.constexpr, SPLIT: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """h[pair, n] = silu(x[tok] . gate_e[n]) * (x[tok] . up_e[n]) for one block of pairs and one column tile.

    SPLIT: program axis 2 takes K_SPLIT of K and writes its float32 partial gate sum to
    h[slice, pair, n] and up sum to h[slice, pair, L + n]; silu waits for the complete sums (torch).
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
    g_rows = w_ptr + expert * s_we + rn * s_wn
    u_rows = g_rows + L * s_wn
    g_srows = ws_ptr + expert * s_wse + rn * s_wsn
    u_srows = g_srows + L * s_wsn
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    if SPLIT:
        k_lo = tl.program_id(2) * K_SPLIT
        k_hi = tl.minimum(k_lo + K_SPLIT, K)
    else:
        k_lo = 0
        k_hi = K
    for k0 in range(k_lo, k_hi, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x_ptr + tok[:, None] * s_xt + rk[None, :] * s_xk, mask=valid[:, None], other=0.0)
        acc_g = _weight_dot(acc_g, a, g_rows, g_srows, n_ok, k0, s_wk, s_wsk, DOT_SCALED, INTERPRET, BN, BK)
        acc_u = _weight_dot(acc_u, a, u_rows, u_srows, n_ok, k0, s_wk, s_wsk, DOT_SCALED, INTERPRET, BN, BK)
    if SPLIT:
        dst = h_ptr + tl.program_id(2) * s_hs + pair[:, None] * s_hp + rn[None, :] * s_hn
        tl.store(dst, acc_g, mask=valid[:, None] & n_ok[None, :])
        tl.store(dst + L * s_hn, acc_u, mask=valid[:, None] & n_ok[None, :])
    else:
        h = acc_g * tl.sigmoid(acc_g) * acc_u
        dst = h_ptr + pair[:, None] * s_hp + rn[None, :] * s_hn
        tl.store(dst, h.to(h_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _moe_down(
    h_ptr, w_ptr, ws_ptr, y_ptr, pairs_ptr, block_experts_ptr, route_w_ptr,
    num_pairs, N, K, K_SPLIT,
    s_hp, s_hk, s_we, s_wn, s_wk, s_wse, s_wsn, s_wsk, s_yp, s_yn, s_ys,
    DOT_SCALED: tl.constexpr, INTERPRET: tl.constexpr, SPLIT: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """y[pair, n] = route_w[pair] * (h[pair] . down_e[n]) in float32.

    SPLIT: program axis 2 takes K_SPLIT of K and writes its weighted partial sum to y[slice, pair, n].
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    pair = tl.load(pairs_ptr + pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    valid = pair < num_pairs
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    rows = w_ptr + expert * s_we + rn * s_wn
    srows = ws_ptr + expert * s_wse + rn * s_wsn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if SPLIT:
        k_lo = tl.program_id(2) * K_SPLIT
        k_hi = tl.minimum(k_lo + K_SPLIT, K)
        y_ptr += tl.program_id(2) * s_ys
    else:
        k_lo = 0
        k_hi = K
    for k0 in range(k_lo, k_hi, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(h_ptr + pair[:, None] * s_hp + rk[None, :] * s_hk, mask=valid[:, None], other=0.0)
        acc = _weight_dot(acc, a, rows, srows, n_ok, k0, s_wk, s_wsk, DOT_SCALED, INTERPRET, BN, BK)
    rw = tl.load(route_w_ptr + pair, mask=valid, other=0.0)
    acc = acc * rw[:, None]
    tl.store(y_ptr + pair[:, None] * s_yp + rn[None, :] * s_yn, acc, mask=valid[:, None] & n_ok[None, :])


PREFILL_PAIRS_PER_EXPERT = 128  # from here on, tiles of 128 x 128 with 8 warps
DECODE_WIDE_PAIRS = 256  # from here on (e.g. 32 tokens x top 8), 128 columns per program


def default_block_m(num_pairs: int, num_experts: int) -> int:
    """16 while experts see few pairs each (decode); bigger tiles once an expert's group fills them."""
    per_expert = num_pairs / max(1, num_experts)
    if per_expert <= 16:
        return 16
    return 32 if per_expert <= 48 else 64


def _block_k(k: int, want: int | None) -> int:
    if want is not None:
        if want % BLOCK or k % want:
            raise ValueError(f"block_k={want} must be a multiple of {BLOCK} that divides K={k}")
        return want
    return next(bk for bk in (128, 64, BLOCK) if k % bk == 0)


def moe_split_k(num_blocks: int, inter: int, hidden: int, bn1: int, bn2: int, bk1: int, bk2: int) -> tuple[int, int]:
    """Auto split of (gate/up over K=H, down over K=L) from the launch shapes alone.

    num_blocks (the aligned buffer's block count) bounds the blocks that hold pairs; at decode it is
    about the number of touched experts, so e.g. T=4, k=8, L=1024, H=7168: 32 x 16 gate/up programs
    -> 3 slices of H; the down launch (32 x 112 programs) stays whole.
    """
    gate_up = auto_split_k(num_blocks * triton.cdiv(inter, bn1), triton.cdiv(hidden, bk1))
    down = auto_split_k(num_blocks * triton.cdiv(hidden, bn2), triton.cdiv(inter, bk2))
    return gate_up, down


def _check_shapes(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale) -> tuple[int, int, int]:
    if x.dim() != 2 or topk_ids.dim() != 2 or topk_weights.shape != topk_ids.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"x [T, H], topk_ids and topk_weights [T, k] expected; got {tuple(x.shape)}, "
                         f"{tuple(topk_ids.shape)}, {tuple(topk_weights.shape)}")
    hidden = x.shape[1]
    num_experts, two_l, half_h = w13.shape
    inter = two_l // 2
    want = {"w13": (num_experts, 2 * inter, hidden // 2), "w13_scale": (num_experts, 2 * inter, hidden // BLOCK),
            "w2": (num_experts, hidden, inter // 2), "w2_scale": (num_experts, hidden, inter // BLOCK)}
    for name, t in (("w13", w13), ("w13_scale", w13_scale), ("w2", w2), ("w2_scale", w2_scale)):
        if t.dtype != torch.uint8 or tuple(t.shape) != want[name]:
            raise ValueError(f"{name}: expected uint8 {want[name]}, got {t.dtype} {tuple(t.shape)}")
    if hidden % BLOCK or inter % BLOCK or two_l % 2:
        raise ValueError(f"H={hidden} and L={inter} must be multiples of {BLOCK}")
    return num_experts, inter, hidden


def fused_moe_mxfp4(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    *,
    a4w4: bool = False,
    variant: str = DEFAULT_VARIANT,
    block_m: int | None = None,
    block_n: int = 64,
    block_k: int | None = None,
    down_block_n: int | None = None,
    down_block_k: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    split_k: int | None = 1,
    down_split_k: int | None = None,
    add: torch.Tensor | None = None,
    x_quantized: bool = False,
) -> torch.Tensor:
    """out[t] = sum_j topk_weights[t, j] * down_j(silu(gate_j(x_t)) * up_j(x_t)), in x's dtype (+ `add`
    [T, H], e.g. the shared experts' output, rounded as `out + add`). x_quantized: x already holds its
    A4W4 values (`rms_norm(quantize=True)`), so it is not quantised again.

    w13 [E, 2L, H/2] (gate rows then up rows) and w2 [E, H, L/2] are packed E2M1 with E8M0 scales
    [E, 2L, H/32] / [E, H, L/32]. Block sizes default by T*k/E (block_m), 64 (block_n) and the
    largest of 128/64/32 dividing K (block_k); `down_*` override the second GEMM's tile only.
    split_k: K slices of both GEMMs (None: `moe_split_k` from the shapes; 1, the default: no split,
    because on an H200 the split measured no faster: 1.53 against 1.53 ms at 4 tokens, 3.72 against
    3.43 ms at 32, bench/results/h200_kernels/kernel_tune_tp2_split.json), each
    clamped to whole BK tiles; `down_split_k` overrides the down GEMM's. Split results equal
    unsplit ones up to float32 summation order.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    num_experts, inter, hidden = _check_shapes(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale)
    tokens, topk = topk_ids.shape
    pairs = tokens * topk
    if pairs == 0:
        return torch.zeros_like(x) if add is None else add.to(x.dtype, copy=True)
    bm = block_m or default_block_m(pairs, num_experts)
    if block_m is None and pairs >= PREFILL_PAIRS_PER_EXPERT * num_experts \
            and (block_n, num_warps, num_stages) == (64, 4, None):
        # prefill-sized: bigger tiles (bench/results/h200_kernels/kernel_tune_moe_prefill.json: 24.9
        # against 28.7 ms at 8192 tokens, TP 2 widths, on an H200)
        bm, block_n, num_warps, num_stages = 128, 128, 8, 3
    elif pairs >= DECODE_WIDE_PAIRS and (block_n, num_warps, num_stages) == (64, 4, None):
        # batched decode: 128 weight columns per program, 3 stages (TP 1 widths on an H200: 7.90 against
        # 8.90 ms at 128 tokens, 4.29 against 4.80 at 32; at 4 tokens 1.22 against 1.19, so not there;
        # bench/results/2026-11-30_h200_engine/kernel_tune.json)
        block_n, num_stages = 128, 3
    bn1, bn2 = block_n, down_block_n or block_n
    bk1 = _block_k(hidden, block_k)
    if down_block_k is None and block_k is not None and inter % block_k == 0:
        down_block_k = block_k  # the shared override, where it divides L
    bk2 = _block_k(inter, down_block_k)
    for name, val in (("split_k", split_k), ("down_split_k", down_split_k)):
        if val is not None and val < 1:
            raise ValueError(f"{name} must be >= 1, got {val}")
    align = moe_align(topk_ids, num_experts, bm)
    num_blocks = align.block_experts.numel()
    auto_gu, auto_down = moe_split_k(num_blocks, inter, hidden, bn1, bn2, bk1, bk2)
    split1, ksplit1 = split_sizes(hidden, bk1, split_k or auto_gu)
    split2, ksplit2 = split_sizes(inter, bk2, down_split_k or split_k or auto_down)
    launch = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    dot_scaled = variant == "dot_scaled"
    interpret = os.environ.get("TRITON_INTERPRET") == "1"

    # x_quantized: x already holds A4W4's values (the norm before quantised it), bf16 holds them exactly
    xa = fake_quantize(x, torch.bfloat16) if a4w4 and not x_quantized else x.to(torch.bfloat16).contiguous()
    # A4W4 keeps h in float32 until the bridge quantises it, as the torch backend does for float32 input.
    # The interpreter's float32 -> bf16 cast truncates (the GPU's rounds to nearest even), so there h is
    # stored as float32 and rounded by the bridge. Split: float32 partial sums [slice, pair, gate | up]
    # that the bridge adds before silu(gate) * up.
    if split1 > 1:
        h_buf = torch.empty(split1, pairs, 2 * inter, dtype=torch.float32, device=x.device)
        s_hp, s_hn, s_hs = h_buf.stride(1), h_buf.stride(2), h_buf.stride(0)
    else:
        h_buf = torch.empty(pairs, inter, dtype=torch.float32 if a4w4 or interpret else torch.bfloat16,
                            device=x.device)
        s_hp, s_hn, s_hs = h_buf.stride(0), h_buf.stride(1), 0
    _moe_gate_up[(num_blocks, triton.cdiv(inter, bn1), split1)](
        xa, w13, w13_scale, h_buf, align.sorted_pairs, align.block_experts,
        pairs, topk, inter, hidden, ksplit1,
        xa.stride(0), xa.stride(1), w13.stride(0), w13.stride(1), w13.stride(2),
        w13_scale.stride(0), w13_scale.stride(1), w13_scale.stride(2), s_hp, s_hn, s_hs,
        DOT_SCALED=dot_scaled, INTERPRET=interpret, SPLIT=split1 > 1, BM=bm, BN=bn1, BK=bk1, **launch,
    )
    h = h_buf if h_buf.dtype == torch.bfloat16 else moe_bridge(h_buf, inter, act=split1 > 1, a4w4=a4w4)
    route_w = topk_weights.reshape(-1).to(torch.float32).contiguous()
    y = torch.empty(split2, pairs, hidden, dtype=torch.float32, device=x.device)
    _moe_down[(num_blocks, triton.cdiv(hidden, bn2), split2)](
        h, w2, w2_scale, y, align.sorted_pairs, align.block_experts, route_w,
        pairs, hidden, inter, ksplit2,
        h.stride(0), h.stride(1), w2.stride(0), w2.stride(1), w2.stride(2),
        w2_scale.stride(0), w2_scale.stride(1), w2_scale.stride(2), y.stride(1), y.stride(2), y.stride(0),
        DOT_SCALED=dot_scaled, INTERPRET=interpret, SPLIT=split2 > 1, BM=bm, BN=bn2, BK=bk2, **launch,
    )
    return moe_combine(y, topk, x.dtype, add)
