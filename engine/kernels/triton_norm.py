"""The decoder's glue as single Triton passes: RMSNorm with the residual add (and the next GEMM's A4W4
quantisation), SwiGLU (with the down projection's), and MLA's rope + cache write.

In torch a bf16 RMSNorm is about eight kernels (upcast, square, mean, add, rsqrt, multiply, downcast,
weight) and the residual add one more; MLA's step between the projections and attention (rope on the
query and key, the latent's norm, concatenation, cast, scatter into the paged cache) about thirty. In a
decode step every one of them is a launch over a few kilobytes, so they cost more in count than in bytes
(issue 11 asks for at most 50 kernels per decoder layer). Each kernel here reads its inputs once per
token and writes the results where the next op reads them.

Numerics follow `model.layers.rms_norm_reference`, `rope_reference` and `F.silu(gate) * up`: statistics,
rotation and SiLU in float32, the residual sum and each output rounded to the model's dtype where torch
rounds them; only the order of the sum of squares (and the last bits of cos/sin and sigmoid) can differ
from torch. The quantised outputs are `fake_quantize_mxfp4` of the kernel's own rounded output, bit for bit.
Runs on a GPU, or on CPU under TRITON_INTERPRET=1 (tests/engine/kernels/test_triton_norm.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from k2bench.engine.kernels.triton_quant import mx_fake_quant, round_to

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@triton.jit
def _rms_row(h, w_ptr, cols, ok, D, eps, DT: tl.constexpr):
    """norm(h) * w for one row h (float32 values already rounded to the model dtype DT), in DT."""
    var = tl.sum(h * h, 0) / D
    n = (h * (1.0 / tl.sqrt(var + eps))).to(DT).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    return (w * n).to(DT)


@triton.jit
def _rms_norm(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, q_ptr, D, s_x, s_r, s_y, s_h, s_q, eps,
              RESIDUAL: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    dt = y_ptr.dtype.element_ty
    h = tl.load(x_ptr + t * s_x + cols, mask=ok, other=0.0)
    if RESIDUAL:
        h = (h.to(tl.float32) + tl.load(r_ptr + t * s_r + cols, mask=ok, other=0.0).to(tl.float32)).to(dt)
        tl.store(h_ptr + t * s_h + cols, h, mask=ok)
    y = _rms_row(h.to(tl.float32), w_ptr, cols, ok, D, eps, dt)
    tl.store(y_ptr + t * s_y + cols, y, mask=ok)
    if QUANT:  # the next GEMM's A4W4 input: blocks of 32 along the row (zeros past D quantise to zeros)
        q = tl.reshape(mx_fake_quant(tl.reshape(y.to(tl.float32), (BLOCK // 32, 32))), (BLOCK,))
        tl.store(q_ptr + t * s_q + cols, q.to(dt), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             quantize: bool = False):
    """RMSNorm over the last dim of x [T, D] (rows may be strided). With `residual` [T, D]: h = x + residual
    in x's dtype, returns (norm(h), h), and with `quantize` (norm(h), h, MXFP4 fake-quantised norm(h)) as
    `model.mxfp4.fake_quantize_mxfp4` computes it; otherwise norm(x)."""
    if quantize and (residual is None or x.shape[-1] % 32):
        raise ValueError("rms_norm quantises only with a residual and a width that is a multiple of 32")
    if x.stride(-1) != 1:
        x = x.contiguous()
    T, D = x.shape
    y = torch.empty(T, D, dtype=x.dtype, device=x.device)
    h = torch.empty_like(y) if residual is not None else y
    q = torch.empty_like(y) if quantize else y
    r = residual if residual is not None else x
    if r.stride(-1) != 1:
        r = r.contiguous()
    if T:
        block = max(32, triton.next_power_of_2(D))
        _rms_norm[(T,)](x, r, weight, y, h, q, D, x.stride(0), r.stride(0), y.stride(0), h.stride(0), q.stride(0),
                        eps, RESIDUAL=residual is not None, QUANT=quantize, BLOCK=block,
                        num_warps=min(16, max(1, block // 512)))
    if residual is None:
        return y
    return (y, h, q) if quantize else (y, h)


@triton.jit(do_not_specialize=["T"])  # a token count: one compiled kernel for every batch
def _swiglu(x_ptr, y_ptr, T, inter, s_x, s_y, QUANT: tl.constexpr, BF16: tl.constexpr, ROWS: tl.constexpr):
    t = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    n = tl.program_id(1) * 32 + tl.arange(0, 32)
    ok = (t < T)[:, None] & (n < inter)[None, :]
    at = x_ptr + t.to(tl.int64)[:, None] * s_x + n[None, :]
    g = tl.load(at, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(at + inter, mask=ok, other=0.0).to(tl.float32)
    dt = y_ptr.dtype.element_ty
    h = round_to(round_to(g * tl.sigmoid(g), dt, BF16) * u, dt, BF16)  # silu and the product each rounded, as torch
    if QUANT:
        h = mx_fake_quant(h)
    tl.store(y_ptr + t.to(tl.int64)[:, None] * s_y + n[None, :], h.to(dt), mask=ok)


def swiglu(x: torch.Tensor, quantize: bool = False) -> torch.Tensor:
    """silu(gate) * up of x = [gate | up] [T, 2I] in x's dtype, rounded where torch's `F.silu(gate) * up`
    rounds; with `quantize`, then MXFP4 fake-quantised per 32 (the down projection's A4W4 input)."""
    T, two = x.shape
    inter = two // 2
    if two % 2 or x.stride(-1) != 1 or (quantize and inter % 32):
        raise ValueError(f"swiglu needs [T, 2I] rows with unit stride (I a multiple of 32 to quantise), got {tuple(x.shape)}")
    y = torch.empty(T, inter, dtype=x.dtype, device=x.device)
    if T:
        rows = 16
        _swiglu[(triton.cdiv(T, rows), triton.cdiv(inter, 32))](
            x, y, T, inter, x.stride(0), y.stride(0), QUANT=quantize, BF16=x.dtype == torch.bfloat16, ROWS=rows)
    return y


@triton.jit
def _rope_pair(a_ptr, b_ptr, cos, sin, mask):
    """Rotate the pair (a, b) in place in float32, stored back in the tensor's dtype."""
    a = tl.load(a_ptr, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr, mask=mask, other=0.0).to(tl.float32)
    dt = a_ptr.dtype.element_ty
    tl.store(a_ptr, (a * cos - b * sin).to(dt), mask=mask)
    tl.store(b_ptr, (b * cos + a * sin).to(dt), mask=mask)


@triton.jit
def _mla_rope_cache(
    q_ptr, kv_ptr, pos_ptr, inv_freq_ptr, w_ptr, cache_ptr, slot_ptr,
    H, s_qt, s_qh, s_kv, s_c, mscale, eps, fp8_max,
    R: tl.constexpr, P: tl.constexpr, H_P2: tl.constexpr, INTERLEAVE: tl.constexpr, FP8: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = P // 2
    i = tl.arange(0, half)
    freq = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_freq_ptr + i)
    cos = tl.cos(freq) * mscale
    sin = tl.sin(freq) * mscale
    if INTERLEAVE:
        ia = 2 * i
        ib = 2 * i + 1
    else:
        ia = i
        ib = i + half
    # the query's rope part, every head, in place
    hh = tl.arange(0, H_P2)
    q_row = q_ptr + t * s_qt + hh[:, None] * s_qh
    _rope_pair(q_row + ia[None, :], q_row + ib[None, :], cos[None, :], sin[None, :], hh[:, None] < H)
    # the cache entry: [norm(latent) | rope(k_pe)], rounded to the model dtype, then to the cache's
    dt = kv_ptr.dtype.element_ty
    rr = tl.arange(0, R)
    lat = _rms_row(tl.load(kv_ptr + t * s_kv + rr).to(tl.float32), w_ptr, rr, rr < R, R, eps, dt).to(tl.float32)
    ka = tl.load(kv_ptr + t * s_kv + R + ia).to(tl.float32)
    kb = tl.load(kv_ptr + t * s_kv + R + ib).to(tl.float32)
    ra = (ka * cos - kb * sin).to(dt).to(tl.float32)
    rb = (kb * cos + ka * sin).to(dt).to(tl.float32)
    if FP8:  # saturate: an fp8 cast past the format's max gives NaN
        lat = tl.minimum(tl.maximum(lat, -fp8_max), fp8_max)
        ra = tl.minimum(tl.maximum(ra, -fp8_max), fp8_max)
        rb = tl.minimum(tl.maximum(rb, -fp8_max), fp8_max)
    row = cache_ptr + tl.load(slot_ptr + t).to(tl.int64) * s_c
    cdt = cache_ptr.dtype.element_ty
    tl.store(row + rr, lat.to(cdt))
    tl.store(row + R + ia, ra.to(cdt))
    tl.store(row + R + ib, rb.to(cdt))


def mla_rope_cache(q_pe: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                   mscale: float, interleave: bool, norm_weight: torch.Tensor, eps: float, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> torch.Tensor:
    """Rope q_pe [T, H, P] in place (a view into the query projection's output is fine) and write each token's
    [RMSNorm(kv[:, :R]) | rope(kv[:, R:])] to kv_cache [blocks, page, R + P] at `slot_mapping`. -> q_pe."""
    T, H, P = q_pe.shape
    R = norm_weight.shape[0]
    width = kv_cache.shape[-1]
    if kv.shape[-1] != R + P or width != R + P:
        raise ValueError(f"shapes do not fit: kv {tuple(kv.shape)}, q_pe {tuple(q_pe.shape)}, cache width {width}")
    if q_pe.stride(-1) != 1 or kv.stride(-1) != 1 or not kv_cache.is_contiguous() or R & (R - 1) or P & (P - 1):
        raise ValueError("mla_rope_cache needs unit-stride last dims and power-of-two latent / rope widths")
    fp8 = kv_cache.dtype in _FP8
    if T:
        _mla_rope_cache[(T,)](
            q_pe, kv, positions, inv_freq, norm_weight, kv_cache, slot_mapping,
            H, q_pe.stride(0), q_pe.stride(1), kv.stride(0), kv_cache.stride(1), mscale, eps,
            torch.finfo(kv_cache.dtype).max if fp8 else 0.0,
            R=R, P=P, H_P2=triton.next_power_of_2(H), INTERLEAVE=interleave, FP8=fp8, num_warps=4,
        )
    return q_pe
