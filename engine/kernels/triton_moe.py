"""Fused routed-expert MoE for MXFP4 experts in Triton: each touched expert's packed weights read once per call.

Design (the same shape as the usual "align, then grouped GEMM" fused MoE):
1. `triton_moe_glue.moe_align` sorts the T*k (token, expert) pairs by expert on the device (two
   kernels) and lays them out in a buffer of static size, each expert's group padded to a multiple of
   BLOCK_M with a sentinel (= T*k), and gives every BLOCK_M block its expert id (-1 for blocks past
   the last group). Shapes depend only on (T, k, E, BLOCK_M): no host synchronisation, so a step can
   be captured in a CUDA graph.
2. `_moe_gate_up`: one program per (block of sorted pairs, tile of L columns). It gathers the
   block's token rows of x (bf16), streams the expert's packed gate rows and the matching up rows
   along K = H into `tl.dot_scaled` (the native scaled MMA on FP4 hardware) and keeps two float32
   accumulators; it writes silu(gate) * up per pair into h [T*k, L].
3. `_moe_down`: the same over H output columns with K = L, scaled by the pair's routing weight,
   written as float32 rows y [T*k, H] (each pair's row exactly once: deterministic).
4. `triton_moe_glue.moe_combine` sums y over the k experts of each token in float32 and casts once
   to x's dtype (one kernel).
5. Split-K (on request, or `moe_split_k` with split_k=None): each GEMM's K is cut into slices that
   run as extra programs on grid axis 2. Gate/up slices write float32 partial gate and up sums [slice, pair, 2L];
   the bridge kernel (`moe_bridge`) adds them and only then applies silu(gate) * up and the usual
   rounding of h. Down slices write weighted partial rows [slice, pair, H] that the combine adds with
   the k experts. Partials instead of atomics: the result stays deterministic; a split changes only
   the float32 summation order.

Numerics: activations enter each GEMM as bf16 (W4), or fake-quantised MXFP4 values, which bf16
holds exactly (A4W4: x before w13 by triton_quant.fake_quantize, h before w2 by the bridge; h is
kept in float32 until it is quantised). Weights are decoded exactly. Accumulation is float32.
Memory: h [T*k, L] (bf16, float32 in A4W4) and y [T*k, H] float32, e.g. 1.9 GB of y at T=8192, k=8,
H=7168.

Under TRITON_INTERPRET=1 the float32 -> bf16 cast truncates, so there h is stored as float32 and
rounded by the bridge (`triton_moe_glue.run_moe`); the GPU stores h as bf16 itself.

Where this family runs and with which tiles: `moe_dispatch` (GPUs with FP4 units, ROCm, the CPU
interpreter, and Hopper experts whose scales the fast layout cannot hold). An explicit dequantisation
before `tl.dot` was a second variant here until it measured slower than `tl.dot_scaled` at every size
(`moe_dispatch` lists the figures). Speed on a GPU is measured in bench/, not here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from k2bench.engine.kernels import moe_dispatch
from k2bench.engine.kernels.moe_dispatch import scaled_tiles
from k2bench.engine.kernels.triton_moe_glue import (
    MoeGemm,
    block_pairs,
    check_split,
    k_range,
    run_moe,
    store_gate_up,
)
from k2bench.engine.model.mxfp4 import BLOCK


@triton.jit
def _weight_dot(acc, a, w_rows, ws_rows, n_ok, k0, s_wk, s_wsk, BK: tl.constexpr):
    """acc [BM, BN] += a [BM, BK] @ W[rows, k0:k0+BK]^T for one expert's MXFP4 rows (row pointers given):
    the packed bytes [BK/2, BN] and their scales [BN, BK/32] as `tl.dot_scaled` takes them."""
    rks = k0 // 32 + tl.arange(0, BK // 32)
    w_s = tl.load(ws_rows[:, None] + rks[None, :] * s_wsk, mask=n_ok[:, None], other=127)
    rk2 = k0 // 2 + tl.arange(0, BK // 2)
    w = tl.load(w_rows[None, :] + rk2[:, None] * s_wk, mask=n_ok[None, :], other=0)
    return tl.dot_scaled(a, None, "bf16", w, w_s, "e2m1", acc)


@triton.jit(do_not_specialize=["num_pairs"])  # one compiled kernel for every batch size (triton_moe_glue)
def _moe_gate_up(
    x_ptr, w_ptr, ws_ptr, h_ptr, pairs_ptr, block_experts_ptr,
    num_pairs, topk, L, K, K_SPLIT,
    s_xt, s_we, s_wn, s_wk, s_wse, s_wsn, s_wsk, s_hp, s_hs,
    SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """h[pair, n] = silu(x[tok] . gate_e[n]) * (x[tok] . up_e[n]) for one block of pairs and one column tile
    (SPLIT: float32 partial gate / up sums of this program's K slice, `store_gate_up`)."""
    expert = tl.load(block_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert < 0:  # a block past the last expert's group
        return
    pair, valid, rn = block_pairs(pairs_ptr, num_pairs, BM, BN)
    tok = pair // topk
    n_ok = rn < L
    g_rows = w_ptr + expert * s_we + rn * s_wn
    u_rows = g_rows + L * s_wn
    g_srows = ws_ptr + expert * s_wse + rn * s_wsn
    u_srows = g_srows + L * s_wsn
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    k_lo, k_hi = k_range(K, K_SPLIT, SPLIT)
    for k0 in range(k_lo, k_hi, BK):
        a = tl.load(x_ptr + tok[:, None] * s_xt + (k0 + tl.arange(0, BK))[None, :], mask=valid[:, None], other=0.0)
        acc_g = _weight_dot(acc_g, a, g_rows, g_srows, n_ok, k0, s_wk, s_wsk, BK)
        acc_u = _weight_dot(acc_u, a, u_rows, u_srows, n_ok, k0, s_wk, s_wsk, BK)
    store_gate_up(h_ptr, pair[:, None] * s_hp + rn[None, :], acc_g, acc_u, valid[:, None] & n_ok[None, :], L, s_hs,
                  SPLIT)


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_down(
    h_ptr, w_ptr, ws_ptr, y_ptr, pairs_ptr, block_experts_ptr, route_w_ptr,
    num_pairs, N, K, K_SPLIT,
    s_hp, s_we, s_wn, s_wk, s_wse, s_wsn, s_wsk, s_yp, s_ys,
    SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """y[pair, n] = route_w[pair] * (h[pair] . down_e[n]) in float32 (SPLIT: this K slice's part in y[slice])."""
    expert = tl.load(block_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert < 0:  # a block past the last expert's group
        return
    pair, valid, rn = block_pairs(pairs_ptr, num_pairs, BM, BN)
    n_ok = rn < N
    rows = w_ptr + expert * s_we + rn * s_wn
    srows = ws_ptr + expert * s_wse + rn * s_wsn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    k_lo, k_hi = k_range(K, K_SPLIT, SPLIT)
    if SPLIT:
        y_ptr += tl.program_id(2) * s_ys
    for k0 in range(k_lo, k_hi, BK):
        a = tl.load(h_ptr + pair[:, None] * s_hp + (k0 + tl.arange(0, BK))[None, :], mask=valid[:, None], other=0.0)
        acc = _weight_dot(acc, a, rows, srows, n_ok, k0, s_wk, s_wsk, BK)
    rw = tl.load(route_w_ptr + pair, mask=valid, other=0.0)
    acc = acc * rw[:, None]
    tl.store(y_ptr + pair[:, None] * s_yp + rn[None, :], acc, mask=valid[:, None] & n_ok[None, :])


def _block_k(k: int, want: int | None) -> int:
    if want is not None:
        if want % BLOCK or k % want:
            raise ValueError(f"block_k={want} must be a multiple of {BLOCK} that divides K={k}")
        return want
    return next(bk for bk in (128, 64, BLOCK) if k % bk == 0)


def moe_split_k(num_blocks: int, inter: int, hidden: int, bn1: int, bn2: int, bk1: int, bk2: int) -> tuple[int, int]:
    """Auto split of (gate/up over K=H, down over K=L) from the launch shapes alone (`moe_dispatch.split_k`).

    num_blocks (the aligned buffer's block count) bounds the blocks that hold pairs; at decode it is
    about the number of touched experts, so e.g. T=4, k=8, L=1024, H=7168: 32 x 16 gate/up programs
    -> 3 slices of H; the down launch (32 x 112 programs) stays whole.
    """
    gate_up = moe_dispatch.split_k(num_blocks * triton.cdiv(inter, bn1), triton.cdiv(hidden, bk1))
    down = moe_dispatch.split_k(num_blocks * triton.cdiv(hidden, bn2), triton.cdiv(inter, bk2))
    return gate_up, down


def _check_weights(hidden, w13, w13_scale, w2, w2_scale) -> tuple[int, int]:
    num_experts, two_l, _ = w13.shape
    inter = two_l // 2
    want = {"w13": (num_experts, 2 * inter, hidden // 2), "w13_scale": (num_experts, 2 * inter, hidden // BLOCK),
            "w2": (num_experts, hidden, inter // 2), "w2_scale": (num_experts, hidden, inter // BLOCK)}
    for name, t in (("w13", w13), ("w13_scale", w13_scale), ("w2", w2), ("w2_scale", w2_scale)):
        if t.dtype != torch.uint8 or tuple(t.shape) != want[name]:
            raise ValueError(f"{name}: expected uint8 {want[name]}, got {t.dtype} {tuple(t.shape)}")
    if hidden % BLOCK or inter % BLOCK or two_l % 2:
        raise ValueError(f"H={hidden} and L={inter} must be multiples of {BLOCK}")
    return num_experts, inter


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
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    down_block_n: int | None = None,
    down_block_k: int | None = None,
    num_warps: int | None = None,
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
    [E, 2L, H/32] / [E, H, L/32]. Tiles default to `moe_dispatch.scaled_tiles` (block_m, block_n,
    num_warps, num_stages; each given one replaces its default) and to the largest of 128/64/32
    dividing K (block_k); `down_*` override the second GEMM's tile only. split_k: K slices of both
    GEMMs (None: `moe_split_k` from the shapes; 1, the default: no split, see `moe_dispatch`), each
    clamped to whole BK tiles; `down_split_k` overrides the down GEMM's. Split results equal unsplit
    ones up to float32 summation order.
    """
    hidden = x.shape[-1]
    num_experts, inter = _check_weights(hidden, w13, w13_scale, w2, w2_scale)
    check_split(split_k, down_split_k)
    auto = scaled_tiles(topk_ids.numel(), num_experts)
    bm = block_m or auto.block_m
    bn1 = block_n or auto.block_n
    bn2 = down_block_n or bn1
    warps = num_warps or auto.num_warps
    stages = num_stages if num_stages is not None else auto.num_stages
    bk1 = _block_k(hidden, block_k)
    if down_block_k is None and block_k is not None and inter % block_k == 0:
        down_block_k = block_k  # the shared override, where it divides L
    bk2 = _block_k(inter, down_block_k)
    launch = {"num_warps": warps} if stages is None else {"num_warps": warps, "num_stages": stages}

    def splits(num_blocks: int) -> tuple[int, int]:
        auto_gu, auto_down = moe_split_k(num_blocks, inter, hidden, bn1, bn2, bk1, bk2)
        return split_k or auto_gu, down_split_k or split_k or auto_down

    return run_moe(x, topk_ids, topk_weights, num_experts=num_experts, hidden=hidden, inter=inter, block_m=bm,
                   splits=splits, a4w4=a4w4, x_quantized=x_quantized, add=add,
                   gate_up=MoeGemm(_moe_gate_up, (w13, w13_scale), (*w13.stride(), *w13_scale.stride()), bn1, bk1,
                                   {"BK": bk1, **launch}),
                   down=MoeGemm(_moe_down, (w2, w2_scale), (*w2.stride(), *w2_scale.stride()), bn2, bk2,
                                {"BK": bk2, **launch}))
