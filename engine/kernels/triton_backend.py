"""Triton backend: the GPU path of the bundled engine.

- MXFP4 linears: `tl.dot_scaled` GEMM reading the packed E2M1 weights + E8M0 scales as stored. W4
  mode feeds activations as bf16; A4W4 quantises them per 32 along K (the engine's quantiser) and
  feeds E2M1 + E8M0 on both sides. Where the hardware has no FP4 units (Hopper, the CPU interpreter)
  Triton upcasts inside the kernel.
- Routed experts: which kernel family and tiles run where is `moe_dispatch`'s table: on NVIDIA GPUs
  without FP4 units `triton_moe_fast.fused_moe_fast` on weights re-laid out once (`prepare_moe`, at
  load) for a few-instruction E2M1 decode; elsewhere (FP4 units, ROCm, the CPU interpreter)
  `triton_moe.fused_moe_mxfp4` on the checkpoint layout through `tl.dot_scaled`. Both sort pairs by
  expert on the device, read each touched expert's weights once per step, no host sync.
- Attention: prefill chunks in the expanded MLA form through PyTorch's flash SDPA
  (`prefill_attention`), decodes in the absorbed form through the paged split-KV kernel
  `triton_attention.mla_decode`, which reads the latent cache in place.
Expert routing is one kernel (`triton_routing`); float weights come from the torch backend.

Runs on a GPU, or on CPU under TRITON_INTERPRET=1 (set before this module is imported), which is
how the tests exercise it. Only what was run is claimed: see engine/README.md.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention.bias import causal_lower_right

from k2bench.engine.kernels import moe_dispatch
from k2bench.engine.kernels.backend import AttentionPlan, BackendError
from k2bench.engine.kernels.moe_dispatch import MOE_KERNELS, fast_tiles, native_fp4
from k2bench.engine.kernels.moe_fast_layout import (
    CHUNK,
    FastExperts,
    NanScaleError,
    ScaleRangeError,
    relayout_experts,
    unrelayout,
)
from k2bench.engine.kernels.torch_backend import TorchBackend
from k2bench.engine.kernels.triton_attention import mla_decode
from k2bench.engine.kernels.triton_moe import fused_moe_mxfp4
from k2bench.engine.kernels.triton_moe_fast import fused_moe_fast
from k2bench.engine.kernels.triton_moe_glue import split_sizes
from k2bench.engine.kernels.triton_norm import mla_rope_cache, rms_norm, swiglu
from k2bench.engine.kernels.triton_quant import fake_quantize
from k2bench.engine.kernels.triton_routing import route_experts
from k2bench.engine.model.attn_meta import AttentionMetadata
from k2bench.engine.model.mxfp4 import BLOCK, dequantize_mxfp4, quantize_mxfp4


@triton.jit
def _mxfp4_gemm(
    x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr,
    M, N, K, K_SPLIT,
    s_xm, s_xk, s_xsm, s_xsk, s_wn, s_wk, s_wsn, s_wsk, s_ym, s_yn, s_ys,
    A_FP4: tl.constexpr, SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """y[M, N] = x[M, K] @ dequant(w)[N, K]^T; w packed [N, K/2] (low nibble first), scales [N, K/32].

    SPLIT: program axis 2 sums only K_SPLIT of K (whole BK tiles) into float32 partials y[slice].
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if SPLIT:
        k_lo = tl.program_id(2) * K_SPLIT
        k_hi = tl.minimum(k_lo + K_SPLIT, K)
        y_ptr += tl.program_id(2) * s_ys
    else:
        k_lo = 0
        k_hi = K
    for k0 in range(k_lo, k_hi, BK):
        rk2 = k0 // 2 + tl.arange(0, BK // 2)
        rks = k0 // 32 + tl.arange(0, BK // 32)
        # weights as the rhs [K/2, N] (packed along K) with scales [N, K/32], as dot_scaled wants them
        b = tl.load(w_ptr + rn[None, :] * s_wn + rk2[:, None] * s_wk, mask=n_ok[None, :], other=0)
        b_s = tl.load(ws_ptr + rn[:, None] * s_wsn + rks[None, :] * s_wsk, mask=n_ok[:, None], other=127)
        if A_FP4:
            a = tl.load(x_ptr + rm[:, None] * s_xm + rk2[None, :] * s_xk, mask=m_ok[:, None], other=0)
            a_s = tl.load(xs_ptr + rm[:, None] * s_xsm + rks[None, :] * s_xsk, mask=m_ok[:, None], other=127)
            acc = tl.dot_scaled(a, a_s, "e2m1", b, b_s, "e2m1", acc)
        else:
            rk = k0 + tl.arange(0, BK)
            a = tl.load(x_ptr + rm[:, None] * s_xm + rk[None, :] * s_xk, mask=m_ok[:, None], other=0.0)
            acc = tl.dot_scaled(a, None, "bf16", b, b_s, "e2m1", acc)
    y = y_ptr + rm[:, None] * s_ym + rn[None, :] * s_yn
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _block_k(k: int) -> int:
    for bk in (128, 64):
        if k % bk == 0:
            return bk
    return BLOCK


# auto split-K only for decode-sized M: prefill launches already have programs to spare
GEMM_SPLIT_MAX_M = 64
# From this many rows on, a GPU without FP4 units runs an MXFP4 linear as one dequantisation to bf16
# and a cuBLAS GEMM. On an H200 (bench/engine_prefill_bench.py, N x K = 18432 x 7168 and 4096 x 7168)
# _mxfp4_gemm won up to 512 rows (0.72 vs 0.92 ms) and lost from 2048 on (2.7 vs 1.4 ms; 11.3 vs
# 3.3 ms at 8192): dot_scaled's upcast caps it near 190 TFLOP/s, cuBLAS reaches ~650.
DEQUANT_MIN_M = 1024


def dequant_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *, a4w4: bool,
                   x_quantized: bool = False) -> torch.Tensor:
    """x @ dequant(W)^T through the BLAS: the same products as `mxfp4_matmul` on a GPU without FP4 units
    (weights decode exactly to bf16; A4W4 activations are quantise-dequantised, which bf16 holds)."""
    # what the kernel feeds its dot
    xq = fake_quantize(x, torch.bfloat16) if a4w4 and not x_quantized else x.to(torch.bfloat16)
    dtype = torch.float32 if x.dtype == torch.float32 else torch.bfloat16  # float32 runs (checks) sum in float32
    return F.linear(xq.to(dtype), dequantize_mxfp4(weight, weight_scale, dtype)).to(x.dtype)


def gemm_split_k(m: int, n: int, k: int) -> int:
    """K slices `mxfp4_matmul` uses by default: e.g. M=4 with N=18432, K=7168 -> 4 (1152 programs
    of 14 K tiles); N=7168, K=9216 -> 10 (9 slices of 8 tiles once rounded to whole tiles)."""
    if m > GEMM_SPLIT_MAX_M:
        return 1
    bm, bn = _gemm_tiles(m, n)
    return moe_dispatch.split_k(triton.cdiv(m, bm) * triton.cdiv(n, bn), triton.cdiv(k, _block_k(k)))


def _gemm_tiles(m: int, n: int) -> tuple[int, int]:
    return (16 if m <= 16 else (32 if m <= 32 else 64)), (64 if n >= 64 else 32)


def mxfp4_matmul(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *, a4w4: bool, split_k: int | None = None,
    x_quantized: bool = False,
) -> torch.Tensor:
    """x [..., K] @ MXFP4 weight [N, K/2] (+ scales [N, K/32])^T -> [..., N] in x's dtype.

    x_quantized (with a4w4): x already holds its MXFP4 values, so no fake quantisation here (on FP4
    hardware they are still packed to codes and scales, which reproduces them exactly).

    split_k: K slices (None: `gemm_split_k`; 1: one program per output tile walks all of K). Slices
    write float32 partials that torch adds, so a split changes only the float32 summation order.
    """
    lead = x.shape[:-1]
    k = x.shape[-1]
    n = weight.shape[0]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    if a4w4 and not native_fp4(x.device):
        # Without FP4 units dot_scaled upcasts both operands anyway; the quantise-dequantise of the
        # activations is exact in bf16, so the bf16 x FP4 form computes the same products, and
        # measured 1.05-2.3x faster on an H200 (bench/engine_kernel_tune.py).
        x2, a4w4 = (x2 if x_quantized else fake_quantize(x2)), False
    if a4w4:
        xa, xs = quantize_mxfp4(x2)
    else:
        xa, xs = x2.to(torch.bfloat16).contiguous(), torch.empty(1, 1, dtype=torch.uint8, device=x.device)
    if split_k is not None and split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {split_k}")
    bm, bn = _gemm_tiles(m, n)
    bk = _block_k(k)
    split, k_split = split_sizes(k, bk, split_k or gemm_split_k(m, n, k))
    out = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    _mxfp4_gemm[(triton.cdiv(m, bm), triton.cdiv(n, bn), split)](
        xa, xs, weight, weight_scale, out,
        m, n, k, k_split,
        xa.stride(0), xa.stride(1), xs.stride(0), xs.stride(1),
        weight.stride(0), weight.stride(1), weight_scale.stride(0), weight_scale.stride(1),
        out.stride(-2), out.stride(-1), out.stride(0) if split > 1 else 0,
        A_FP4=a4w4, SPLIT=split > 1, BM=bm, BN=bn, BK=bk,
    )
    if split > 1:
        y.copy_(out.sum(dim=0))  # one rounding to x's dtype, as the kernel's own store does
    return y.reshape(*lead, n)


def _check_kept(w13: torch.Tensor) -> None:
    if w13.numel() == 0:
        raise BackendError("these experts' checkpoint layout was released at load (the backend that loaded them "
                           "keeps only its fast layout); load with backend='torch' to switch backends or MoE "
                           "variants afterwards")


def _dense_split(programs: int, k: int, rows: int) -> int:
    """K slices of one dense GEMM run as a one-expert MoE: one expert gives few programs (e.g. 32 tiles of
    64 rows for a 2048-wide shared expert), so K is split until the SMs all stream weights, but only as
    far as the float32 partials (written, then read back) cost at most a quarter of the weight bytes."""
    cap = (k * 17 // 32) // (rows * 8 * 4)  # a weight row is K * 17/32 bytes (E2M1 + E8M0)
    return moe_dispatch.split_k(programs, triton.cdiv(k, CHUNK), max_slices=cap)


@dataclass
class TritonPlan(AttentionPlan):
    """One step's attention plan: prefill chunks as the torch backend lists them, decodes as tensors."""

    prefills: list[tuple[int, int, int, torch.Tensor]]  # (first token, end, context length, slots [ctx])
    decode_rows: torch.Tensor | None  # rows of the flat batch that are one-token (decode) sequences
    decode_tables: torch.Tensor | None  # their block tables
    decode_lens: torch.Tensor | None  # their context lengths


# A chunk at least this share of its context runs as a padded square call (cuDNN's flash kernel), a
# shorter one with the lower-right causal mask (`chunk_path`). On an H200 (bench/engine_prefill_bench.py
# --chunks, 2026-12-03) the square call was the cheaper from a quarter on (3.08 against 3.39 ms at 2048 x
# 8192, 1.23 against 1.27 at 1024 x 4096, 0.63 against 0.66 at 512 x 2048) and the lower-right below it
# (2.84 against 3.06 ms at 1536 x 8192, 0.62 against 0.65 at 256 x 2048).
SQUARE_MIN_SHARE = 1 / 4


def chunk_path(n: int, ctx: int) -> str:
    """How `prefill_attention` runs a chunk of n queries over a context of ctx keys (its own included):
    "square" (padded to `query_bucket(ctx)` rows, causal upper-left) or "lower_right"."""
    return "square" if n >= SQUARE_MIN_SHARE * ctx else "lower_right"


def prefill_attention(
    q_nope: torch.Tensor, q_pe: torch.Tensor, kv: torch.Tensor, scale: float, w_uk: torch.Tensor, w_uv: torch.Tensor,
    path: str | None = None,
) -> torch.Tensor:
    """One sequence's prefill chunk in the expanded MLA form through PyTorch's fused SDPA.

    q_nope [n, H, nope], q_pe [n, H, rope]; kv [ctx, r + rope] are the sequence's cached latents
    (the chunk's own tokens are the last n). Per-head keys [k_nope | k_pe] and values are rebuilt
    from the latents with kv_b_proj's halves w_uk [H, nope, r] and w_uv [H, v, r]: a prefill has
    as many queries as keys, so the expanded form (head dim nope + rope = 192) costs about a third of
    the absorbed one's (r + rope = 576) FLOPs, and the fused kernels never hold the score matrix.
    The query at chunk row i sits at position ctx - n + i (causal mask aligned to the lower right).

    Two ways through SDPA (`path`, by default `chunk_path(n, ctx)`):
    - "square": a causal call over `query_bucket(ctx)` rows. The chunk's queries sit at their
      positions, zero rows stand in front of them (earlier positions) and behind the context (later ones);
      on sm_90 PyTorch runs this on cuDNN's flash kernel (~640 TFLOP/s on an H200), which builds one
      execution plan per shape (~25 ms of host time): the buckets keep the shapes few. Its cost is the
      whole context's, whatever n is;
    - "lower_right": the chunk alone under the lower-right causal mask, on exact shapes. In bf16 / fp16
      on a GPU the values are zero-padded to the key width, because the flash kernel (FlashAttention-2)
      takes that mask only with equal widths; unpadded, only the memory-efficient kernel takes it, which
      on an H200 was as fast below 512 queries and 1.3-1.4x slower from 1024 (2.99 against 2.26 ms at
      1024 x 8192, 3.98 against 2.84 at 1536 x 8192).
    bench/engine_prefill_bench.py --chunks times both per (n, ctx); bench/engine_wave_bench.py shows what
    they cost inside a one-wave level's mixed steps.

    Tensors go in as [1, H, len, D] (the fused kernels take 4-D only; 3-D falls back to the math
    kernel and its materialised scores) and the square call's values keep their own width v, which the
    cuDNN kernel accepts; tests/engine/kernels/test_triton_gpu_shapes.py checks on the GPU that a fused
    kernel takes these shapes.
    """
    n, H, _ = q_nope.shape
    ctx = kv.shape[0]
    r = w_uk.shape[-1]
    path = chunk_path(n, ctx) if path is None else path
    if path not in ("square", "lower_right"):
        raise ValueError(f"unknown prefill attention path {path!r}: square, lower_right")
    front = back = 0
    if path == "square":
        front, back = ctx - n, query_bucket(ctx) - ctx
        q_nope, q_pe = (F.pad(t, (0, 0, 0, 0, front, back)) for t in (q_nope, q_pe))
        kv = F.pad(kv, (0, 0, 0, back))  # keys past the context: only the rows behind it can see them
    kv = kv.to(q_nope.dtype)
    latent, k_pe = kv[:, :r], kv[:, r:]
    rows, keys = q_nope.shape[0], kv.shape[0]
    k_nope = torch.einsum("cr,hdr->hcd", latent, w_uk)  # [H, keys, nope]
    v = torch.einsum("cr,hvr->hcv", latent, w_uv).unsqueeze(0)  # [1, H, keys, v]
    k = torch.cat((k_nope, k_pe.unsqueeze(0).expand(H, keys, -1)), dim=-1).unsqueeze(0)
    q = torch.cat((q_nope, q_pe.to(q_nope.dtype)), dim=-1).transpose(0, 1).unsqueeze(0)  # [1, H, rows, D]
    if rows == keys:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        width = v.shape[-1]
        if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and width < q.shape[-1]:  # flash's dtypes
            v = F.pad(v, (0, q.shape[-1] - width))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(rows, keys), scale=scale)[..., :width]
    return o[0, :, front : front + n].transpose(0, 1)  # [n, H, v]


def query_bucket(n: int) -> int:
    """n rounded up to a step of n/16..n/8 (at least 64), so the square SDPA calls meet few shapes.

    In a one-wave level the step budget cuts each prompt at a new length every step (the budget less the
    decodes); without buckets every mixed step built new cuDNN plans (bench/engine_wave_bench.py on an
    H200: mixed steps of 160 ms against 77 ms for the same tokens at a length seen before)."""
    step = max(64, 1 << max(0, n.bit_length() - 4))
    return -(-n // step) * step


def prefill_buckets(max_ctx: int) -> list[int]:
    """Every length `query_bucket` gives for contexts up to max_ctx, smallest first."""
    out = [query_bucket(1)]
    while out[-1] < query_bucket(max_ctx):
        out.append(query_bucket(out[-1] + 1))
    return out


class TritonBackend(TorchBackend):
    name = "triton"
    graph_decode = True  # decode_plan reads no tensor on the host

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(device)
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise BackendError("the triton backend needs a GPU, or TRITON_INTERPRET=1 on CPU (tests only)")
        # the routed experts' kernel family (moe_dispatch.MOE_KERNELS): "fast" (triton_moe_fast's layout) or
        # "dot_scaled" (triton_moe on the checkpoint layout); None: moe_dispatch.moe_kernel's choice
        self.moe_variant: str | None = None
        self._fast: dict[int, tuple[weakref.ref, FastExperts | None]] = {}  # by id(w13), checked by ref
        self._dense: dict[int, tuple[weakref.ref, FastExperts | None]] = {}  # dense MLPs as one expert
        self._one_expert: tuple[torch.Tensor, torch.Tensor] | None = None  # ids 0 / weights 1 per token

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None, *, a4w4: bool = False,
        x_quantized: bool = False,
    ) -> torch.Tensor:
        if weight_scale is None:
            return F.linear(x, weight)
        if x.numel() >= DEQUANT_MIN_M * x.shape[-1] and not native_fp4(x.device):
            return dequant_linear(x, weight, weight_scale, a4w4=a4w4, x_quantized=x_quantized)
        return mxfp4_matmul(x, weight, weight_scale, a4w4=a4w4, x_quantized=x_quantized)

    def route_experts(self, scores, bias, *, top_k, n_group, topk_group, renormalize, scale):
        """One kernel (triton_routing) instead of the torch reference's dozen."""
        return route_experts(scores, bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
                             renormalize=renormalize, scale=scale)

    def _moe_variant(self, device: torch.device) -> str:
        if self.moe_variant is None:
            return moe_dispatch.moe_kernel(device)
        if self.moe_variant not in MOE_KERNELS:
            raise BackendError(f"unknown MoE kernel {self.moe_variant!r}; valid: {', '.join(MOE_KERNELS)}")
        return self.moe_variant

    def _fast_experts(self, w13, w13_scale, w2, w2_scale, *, dense: bool = False) -> FastExperts | None:
        """The fast layout of one expert stack, or of one dense MLP as a stack of one expert (`dense`), built
        on first use (a routed stack normally by `prepare_moe` at load) and kept while w13 lives; None where
        its scales do not fit that layout (the caller takes its checkpoint-layout path then)."""
        cache = self._dense if dense else self._fast
        hit = cache.get(id(w13))
        if hit is not None and hit[0]() is w13:
            return hit[1]
        _check_kept(w13)
        stack = (w13, w13_scale, w2, w2_scale)
        try:
            fast = relayout_experts(*(t[None] for t in stack) if dense else stack)
        except NanScaleError as exc:
            raise BackendError(f"MXFP4 {'MLP' if dense else 'experts'}: {exc}") from exc
        except ScaleRangeError:
            fast = None
        cache[id(w13)] = (weakref.ref(w13), fast)
        return fast

    def prepare_moe(self, w13, w13_scale, w2, w2_scale) -> bool:
        """Re-lay packed experts for the fast variant once, at load time. True (the checkpoint tensors may
        go) when the fast layout took them: this backend then reads only its own copy. A model that must
        also run other backends or variants later (bench/engine_gpu_bench.py swaps them) is loaded with
        the torch backend, whose `prepare_moe` keeps the checkpoint layout; the fast copy is then built
        on first use, next to it."""
        if w13_scale is None or w2_scale is None or self._moe_variant(w13.device) != "fast":
            return False
        return self._fast_experts(w13, w13_scale, w2, w2_scale) is not None

    def fused_moe(self, x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, *, a4w4=False, add=None,
                  x_quantized=False):
        if w13_scale is None or w2_scale is None:  # float experts: the reference path
            return super().fused_moe(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, a4w4=a4w4, add=add,
                                     x_quantized=x_quantized)
        variant = self._moe_variant(x.device)
        if variant == "fast":
            fast = self._fast_experts(w13, w13_scale, w2, w2_scale)
            if fast is not None:
                return fused_moe_fast(x, topk_ids, topk_weights, fast, a4w4=a4w4, add=add, x_quantized=x_quantized)
        _check_kept(w13)
        return fused_moe_mxfp4(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, a4w4=a4w4, add=add,
                               x_quantized=x_quantized)

    def prepare_dense(self, w13, w13_scale, w2, w2_scale) -> bool:
        """On the fast variant a dense MLP's one-expert fast copy is built at load, and True (the checkpoint
        tensors may go) when its scales fit that layout: `dense_mlp` then serves decode batches from it as
        before and prefill batches by decoding it back (`_dense_dequantised`). Elsewhere (or where the
        scales do not fit) nothing changes: the checkpoint layout stays and is read as before."""
        if w13_scale is None or w2_scale is None or self._moe_variant(w13.device) != "fast":
            return False
        return self._fast_experts(w13, w13_scale, w2, w2_scale, dense=True) is not None

    def dense_mlp(self, x, w13, w13_scale, w2, w2_scale, *, a4w4=False, x_quantized=False):
        """Below DEQUANT_MIN_M rows on the fast variant, the MLP runs as a one-expert fused MoE: the fast
        layout's decode instead of dot_scaled's, and no bf16 round trip of gate/up between the GEMMs.
        Larger batches (prefill) dequantise for cuBLAS: through `linear` while the checkpoint tensors are
        kept, from the fast copy once `prepare_dense` let them go (the same products either way)."""
        rows = x.numel() // x.shape[-1]
        released = w13_scale is not None and w13.numel() == 0
        if not released and (w13_scale is None or w2_scale is None or rows == 0 or rows >= DEQUANT_MIN_M
                             or self._moe_variant(x.device) != "fast"):
            return super().dense_mlp(x, w13, w13_scale, w2, w2_scale, a4w4=a4w4, x_quantized=x_quantized)
        fast = self._fast_experts(w13, w13_scale, w2, w2_scale, dense=True)  # released: the copy prepare built
        if fast is None:
            return super().dense_mlp(x, w13, w13_scale, w2, w2_scale, a4w4=a4w4, x_quantized=x_quantized)
        if rows == 0:
            return x.new_empty(*x.shape[:-1], fast.hidden)
        if rows >= DEQUANT_MIN_M:
            return self._dense_dequantised(x, fast, a4w4=a4w4, x_quantized=x_quantized)
        ids, weights = self._one_expert_routing(rows, x.device)
        x2 = x.reshape(rows, x.shape[-1])
        cfg = fast_tiles(rows, 1)
        blocks = triton.cdiv(rows, cfg.block_m)
        split1 = _dense_split(blocks * triton.cdiv(fast.inter, cfg.block_n), fast.hidden, rows)
        split2 = _dense_split(blocks * triton.cdiv(fast.hidden, cfg.block_n), fast.inter, rows)
        y = fused_moe_fast(x2, ids, weights, fast, a4w4=a4w4, x_quantized=x_quantized, config=cfg, split_k=split1,
                           down_split_k=split2)
        return y.reshape(*x.shape[:-1], fast.hidden)

    def _dense_dequantised(self, x: torch.Tensor, fast: FastExperts, *, a4w4: bool, x_quantized: bool) -> torch.Tensor:
        """A prefill-size batch through the fast copy alone: each weight goes back to its checkpoint bytes
        (`unrelayout`, exact) and through `dequant_linear`, as `linear` runs the kept checkpoint tensors on
        a GPU without FP4 units, so the output is that path's bit for bit; only one weight's bytes are
        rebuilt at a time (a quarter of the bf16 copy `dequant_linear` makes anyway)."""
        w, s = unrelayout(fast.w13[0], fast.s13[0], fast.hidden)
        gate_up = dequant_linear(x, w, s, a4w4=a4w4, x_quantized=x_quantized)
        del w, s
        w, s = unrelayout(fast.w2[0], fast.s2[0], fast.inter)
        return dequant_linear(self.swiglu(gate_up, a4w4), w, s, a4w4=a4w4, x_quantized=a4w4)

    def _one_expert_routing(self, rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert 0 with weight 1 for `rows` tokens: views of buffers made once (no kernel per call)."""
        if self._one_expert is None or self._one_expert[0].device != device:
            self._one_expert = (torch.zeros(DEQUANT_MIN_M, 1, dtype=torch.int64, device=device),
                                torch.ones(DEQUANT_MIN_M, 1, dtype=torch.float32, device=device))
        ids, weights = self._one_expert
        return ids[:rows], weights[:rows]

    def plan_attention(self, meta: AttentionMetadata, kv_dim: int) -> TritonPlan:
        """Prefill chunks are listed (with their cache slots); decodes stay tensors for the paged kernel."""
        cu = meta.cu_seqlens_q.tolist()
        ctx_lens = meta.context_lens.tolist()
        bs = meta.block_size
        tables = meta.block_tables
        if len(cu) - 1 == cu[-1]:  # pure decode step: every sequence brings one token
            return TritonPlan([], None, tables, meta.context_lens)
        dev = tables.device
        offs = torch.arange(bs, device=dev)
        prefills = []
        decodes = []
        for b, ctx in enumerate(ctx_lens):
            s, e = cu[b], cu[b + 1]
            if e - s == 1:
                decodes.append(b)
                continue
            nblk = -(-ctx // bs)
            slots = (tables[b, :nblk].to(torch.long).unsqueeze(1) * bs + offs).reshape(-1)[:ctx]
            prefills.append((s, e, ctx, slots))
        if not decodes:
            return TritonPlan(prefills, None, None, None)
        seqs = torch.tensor(decodes, device=dev)
        rows = meta.cu_seqlens_q[seqs].to(torch.long)
        return TritonPlan(prefills, rows, tables[seqs], meta.context_lens[seqs])

    def decode_plan(self, meta: AttentionMetadata, kv_dim: int) -> TritonPlan:
        """The plan of a step where every sequence brings one token, from tensors only (no host sync)."""
        return TritonPlan([], None, meta.block_tables, meta.context_lens)

    def mla(self, q_nope, q_pe, kv_cache, plan, scale, w_uk, w_uv):
        """Prefill chunks expanded through flash SDPA; decodes absorbed, in the paged split-KV kernel."""
        if not isinstance(plan, TritonPlan):
            return super().mla(q_nope, q_pe, kv_cache, plan, scale, w_uk, w_uv)
        T, H, _ = q_nope.shape
        if not plan.prefills and plan.decode_rows is None and plan.decode_tables is not None:
            return self._decode(q_nope, q_pe, kv_cache, plan.decode_tables, plan.decode_lens, scale, w_uk, w_uv)
        out = torch.empty(T, H, w_uv.shape[1], dtype=q_nope.dtype, device=q_nope.device)
        flat = kv_cache.view(-1, kv_cache.shape[-1])
        for s, e, _ctx, slots in plan.prefills:
            out[s:e] = prefill_attention(q_nope[s:e], q_pe[s:e], flat[slots], scale, w_uk, w_uv)
        if plan.decode_rows is not None:
            rows = plan.decode_rows
            out[rows] = self._decode(q_nope[rows], q_pe[rows], kv_cache, plan.decode_tables, plan.decode_lens,
                                     scale, w_uk, w_uv)
        return out

    def warm_up_mla(self, w_uk, w_uv, rope_dim, max_ctx, scale) -> int:
        """One square prefill call per bucket length up to max_ctx, so cuDNN builds its plans (11-44 ms of
        host time each on an H200 host, bench/prefill_shape_cost.py) before serving, not inside a step:
        square calls only meet bucket lengths, at most 4x the step budget (the caller's max_ctx)."""
        if w_uk.device.type != "cuda":
            return 0
        H, nope, r = w_uk.shape
        buckets = prefill_buckets(max_ctx)
        for b in buckets:
            q_nope = torch.zeros(b, H, nope, dtype=w_uk.dtype, device=w_uk.device)
            q_pe = torch.zeros(b, H, rope_dim, dtype=w_uk.dtype, device=w_uk.device)
            kv = torch.zeros(b, r + rope_dim, dtype=w_uk.dtype, device=w_uk.device)
            prefill_attention(q_nope, q_pe, kv, scale, w_uk, w_uv)
        torch.cuda.synchronize(w_uk.device)
        return len(buckets)

    def warm_up_decode(self, w_uk, rope_dim, kv_cache, scale) -> int:
        """The paged decode kernel unsplit and split (its two compiled variants; the sizes that vary per step
        are not specialised, `triton_attention.DECODE_UNSPECIALISED`), for one sequence of one token in
        the cache's first block, with the dtypes and layouts a step passes. CUDA graph capture meets only
        the split counts of the captured batch sizes at the full table width; an eager mixed step meets any."""
        if kv_cache.device.type != "cuda":
            return 0
        dev = kv_cache.device
        H, _, r = w_uk.shape
        q_lat = torch.zeros(1, H, r, dtype=w_uk.dtype, device=dev)
        q_pe = torch.zeros(1, H, rope_dim, dtype=w_uk.dtype, device=dev)
        tables = torch.zeros(1, 1, dtype=torch.int64, device=dev)
        lens = torch.ones(1, dtype=torch.int64, device=dev)
        for splits in (1, 2):
            mla_decode(q_lat, q_pe, kv_cache, tables, lens, scale, num_splits=splits)
        torch.cuda.synchronize(dev)
        return 2

    @staticmethod
    def _decode(q_nope, q_pe, kv_cache, tables, lens, scale, w_uk, w_uv):
        q_lat = torch.einsum("thd,hdr->thr", q_nope, w_uk)
        o_lat = mla_decode(q_lat, q_pe.to(q_lat.dtype), kv_cache, tables, lens, scale)
        return torch.einsum("thr,hvr->thv", o_lat.to(w_uv.dtype), w_uv)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                 quantize: bool = False):
        return rms_norm(x, weight, eps, residual, quantize)

    def swiglu(self, x: torch.Tensor, quantize: bool = False) -> torch.Tensor:
        return swiglu(x, quantize)

    def mla_rope_cache(self, q_pe, kv, positions, rotary, norm_weight, eps, kv_cache, slot_mapping):
        return mla_rope_cache(q_pe, kv, positions, rotary.inv_freq(positions.device), rotary.mscale,
                              rotary.interleave, norm_weight, eps, kv_cache, slot_mapping)
