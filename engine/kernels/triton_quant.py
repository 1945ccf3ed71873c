"""MXFP4 activation fake-quantisation (the A4W4 numerics) as one Triton pass.

`model.mxfp4.fake_quantize_mxfp4` in torch is about a dozen elementwise and reduction kernels, each a
full pass over the activations in float32; at prefill sizes that was ~10 ms of an 8k-token step on an
H200 and at decode sizes a few dozen launches per layer. This kernel reads each block of 32 once,
computes its shared exponent with the default `even` rule on the float32 bits (amax rounded at E2M1
mantissa precision, then floor(log2) - 2), rounds every element to the E2M1 grid by the same midpoint
comparisons as `e2m1_encode` (nearest, ties to even, saturating at 6) and writes value x 2^e in the
requested dtype. Blocks holding a NaN or an infinity come out NaN, as in torch. Bit-for-bit equal to
the torch function (tests/engine/kernels/test_triton_quant.py, under the interpreter and on a GPU).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from k2bench.engine.model.mxfp4 import BLOCK, fake_quantize_mxfp4

ROWS = 64  # blocks of 32 per program


@triton.jit
def mx_fake_quant(x):
    """Float32 blocks [R, 32] -> their MXFP4 quantise-dequantised values (float32); shared by the glue
    kernels that quantise what they have just computed (triton_moe_glue's bridge)."""
    a = tl.abs(x)
    bad = tl.max(((x != x) | (a == float("inf"))).to(tl.int32), axis=1)
    amax = tl.max(tl.where(x != x, 0.0, a), axis=1)
    # even rule on the bits: add half an E2M1 ulp of the amax, keep sign + exponent; floor(log2) - 2
    bits = amax.to(tl.int32, bitcast=True)
    field = ((bits + (1 << 21)) >> 23) & 0xFF
    e = tl.where(field == 0xFF, 127, field - 127 - 2)
    e = tl.where(amax > 0, e, -127)
    e = tl.minimum(tl.maximum(e, -127), 127)
    # 2^e and 2^-e from their bits (2^-127 is the one subnormal the range needs)
    scale = tl.where(e >= -126, ((e + 127) << 23), 1 << 22).to(tl.float32, bitcast=True)
    inv = tl.where(e <= 126, ((127 - e) << 23), 1 << 22).to(tl.float32, bitcast=True)
    m = a * inv[:, None]
    q = tl.where(m > 0.25, 0.5, 0.0)
    q = tl.where(m >= 0.75, 1.0, q)
    q = tl.where(m > 1.25, 1.5, q)
    q = tl.where(m >= 1.75, 2.0, q)
    q = tl.where(m > 2.5, 3.0, q)
    q = tl.where(m >= 3.5, 4.0, q)
    q = tl.where(m > 5.0, 6.0, q)
    q = tl.where(x < 0, -q, q) * scale[:, None]
    return tl.where(bad[:, None] != 0, float("nan"), q)


@triton.jit
def round_bf16(x):
    """Float32 -> the nearest bf16 value (ties to even), kept in float32, so a later cast to bf16 is exact.
    Why by hand: the CPU interpreter's float32 -> bf16 cast truncates where the GPU's rounds."""
    b = x.to(tl.uint32, bitcast=True)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, r)


@triton.jit
def round_to(x, dt: tl.constexpr, BF16: tl.constexpr):
    """Float32 x rounded to dt's precision (nearest), kept in float32; BF16 says dt is bfloat16 (rounded by
    `round_bf16`, which the interpreter gets right)."""
    if BF16:
        return round_bf16(x)
    return x.to(dt).to(tl.float32)


@triton.jit
def _fake_quant(x_ptr, y_ptr, num_blocks, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = rows < num_blocks
    offs = rows.to(tl.int64)[:, None] * 32 + tl.arange(0, 32)[None, :]
    x = tl.load(x_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, mx_fake_quant(x).to(y_ptr.dtype.element_ty), mask=ok[:, None])


def fake_quantize(x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Quantise-dequantise x per 32 along the last dim (scale rule `even`), as `out_dtype` (default x's)."""
    k = x.shape[-1]
    if k % BLOCK:
        raise ValueError(f"MXFP4 needs the last dim to be a multiple of {BLOCK}, got {k}")
    if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":  # no Triton here: the reference
        return fake_quantize_mxfp4(x).to(out_dtype or x.dtype)
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    num_blocks = x.numel() // BLOCK
    if num_blocks:
        _fake_quant[(triton.cdiv(num_blocks, ROWS),)](x, y, num_blocks, ROWS=ROWS)
    return y
