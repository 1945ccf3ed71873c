"""MXFP4 against the OCP MX v1.0 rules, checked with an independent scalar reference written here."""

from __future__ import annotations

import math

import pytest
import torch

from k2bench.engine.model.mxfp4 import (
    dequantize_mxfp4,
    e2m1_decode,
    e2m1_encode,
    fake_quantize_mxfp4,
    pack_fp4,
    quantize_mxfp4,
    shared_exponent,
    unpack_fp4,
)

pytestmark = pytest.mark.engine

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def ref_round(v: float) -> float:
    """Nearest E2M1 magnitude by exhaustive search; ties go to the even code (index); saturate at 6."""
    a = min(abs(v), 6.0)
    best = min(range(8), key=lambda i: (abs(GRID[i] - a), i % 2))
    return math.copysign(GRID[best], v)


def ref_exponent(amax: float, rule: str) -> int:
    if amax == 0:
        return -127
    if rule == "ocp":
        e = math.floor(math.log2(amax)) - 2
    elif rule == "ceil":
        e = math.ceil(math.log2(amax / 6))
    else:  # even: round amax to a power of two at one mantissa bit past E2M1's (1.75 and up rounds up)
        m, ex = math.frexp(amax)  # amax = m * 2^ex, m in [0.5, 1)
        e = (ex if m >= 0.875 else ex - 1) - 2
    return max(-127, min(127, e))


def ref_quant_dequant(x: torch.Tensor, rule: str) -> torch.Tensor:
    out = torch.empty_like(x)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            blk = x[r, b * 32 : (b + 1) * 32].tolist()
            e = ref_exponent(max(abs(v) for v in blk), rule)
            s = 2.0**e
            out[r, b * 32 : (b + 1) * 32] = torch.tensor([ref_round(v / s) * s for v in blk])
    return out


def test_all_16_codes_decode_and_roundtrip():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = e2m1_decode(codes)
    assert vals[:8].tolist() == GRID
    assert vals[8:].tolist() == [-v for v in GRID]
    assert torch.signbit(vals[8:]).all()  # code 8 is -0
    again = e2m1_encode(vals)
    assert again.tolist() == codes.tolist()


def test_ties_to_even_and_saturation():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_decode(e2m1_encode(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert e2m1_decode(e2m1_encode(-ties)).tolist() == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]
    big = torch.tensor([6.0, 6.5, 7.0, 100.0, float("inf"), -7.0])
    assert e2m1_decode(e2m1_encode(big)).tolist() == [6.0, 6.0, 6.0, 6.0, 6.0, -6.0]
    x = torch.linspace(-8, 8, 2001)
    ours = e2m1_decode(e2m1_encode(x))
    assert ours.tolist() == [ref_round(v) for v in x.tolist()]


def test_pack_nibble_order():
    codes = torch.tensor([[1, 2, 3, 4, 15, 0]], dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x0F]]  # element 2i in the low nibble
    assert unpack_fp4(packed).tolist() == codes.tolist()
    with pytest.raises(ValueError):
        pack_fp4(torch.zeros(1, 3, dtype=torch.uint8))


@pytest.mark.parametrize("rule", ["ocp", "even", "ceil"])
def test_quantise_matches_scalar_reference(rule):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 128, generator=g) * torch.tensor([1e-3, 0.1, 1.0, 3.0, 100.0, 7.0]).unsqueeze(1)
    x[5, :32] = torch.tensor([7.0] + [0.3] * 31)  # amax just under 8: the rules disagree here
    packed, scale = quantize_mxfp4(x, rule)
    assert packed.shape == (6, 64) and packed.dtype == torch.uint8
    assert scale.shape == (6, 4) and scale.dtype == torch.uint8
    ours = dequantize_mxfp4(packed, scale)
    torch.testing.assert_close(ours, ref_quant_dequant(x, rule), atol=0, rtol=0)


def test_scale_rules_differ_as_documented():
    amax = torch.tensor([7.0, 6.0, 1.0, 0.0])
    assert shared_exponent(amax, "ocp").tolist() == [0, 0, -2, -127]
    assert shared_exponent(amax, "even").tolist() == [1, 0, -2, -127]
    assert shared_exponent(amax, "ceil").tolist() == [1, 0, -2, -127]
    assert shared_exponent(torch.tensor([5.0]), "ceil").tolist() == [0]
    assert shared_exponent(torch.tensor([5.0]), "ocp").tolist() == [0]
    with pytest.raises(ValueError, match="valid: ocp, even, ceil"):
        shared_exponent(amax, "nearest")


def test_zero_block_nan_scale_and_extremes():
    x = torch.zeros(2, 64)
    x[1, 32:] = float("nan")
    x[1, :32] = 3.0
    packed, scale = quantize_mxfp4(x)
    assert scale[0].tolist() == [0, 0]
    assert scale[1, 1].item() == 0xFF
    deq = dequantize_mxfp4(packed, scale)
    assert (deq[0] == 0).all()
    assert torch.isnan(deq[1, 32:]).all()
    assert (deq[1, :32] == 3.0).all()
    nan_scale = torch.tensor([[0xFF]], dtype=torch.uint8)
    assert torch.isnan(dequantize_mxfp4(torch.zeros(1, 16, dtype=torch.uint8), nan_scale)).all()
    tiny = torch.full((1, 32), 1e-40)  # below 2^-127 * 0.5: scale clamps to code 0
    _, s = quantize_mxfp4(tiny)
    assert s.item() == 0


@pytest.mark.parametrize("rule", ["ocp", "even", "ceil"])
def test_fast_fake_quant_equals_quantise_dequantise(rule):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 256, generator=g) * torch.logspace(-3, 3, 16).unsqueeze(1)
    x[0, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0] * 4)  # ties and saturation
    x[1, 40] = float("inf")
    ref = dequantize_mxfp4(*quantize_mxfp4(x, rule))
    torch.testing.assert_close(fake_quantize_mxfp4(x, rule), ref, atol=0, rtol=0, equal_nan=True)


def test_fake_quant_and_shapes():
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    y = fake_quantize_mxfp4(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert torch.equal(fake_quantize_mxfp4(y), y)  # idempotent: already on the grid
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.randn(2, 48))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantise_every_byte_and_scale_code_matches_scalar_reference(dtype):
    """Every (byte, scale code) pair, incl. the NaN code and subnormal scales, decodes to value * 2^(code-127)."""
    vals = GRID + [-v for v in GRID]
    codes = torch.arange(256)
    packed = torch.arange(256, dtype=torch.uint8).repeat(256, 1)  # row = scale code, 16 blocks of 16 bytes
    scale = codes.to(torch.uint8).unsqueeze(1).repeat(1, 16)
    got = dequantize_mxfp4(packed, scale, dtype).view(256, 256, 2).double()
    for c in (0, 1, 100, 126, 127, 128, 200, 254, 255):
        for b in range(256):
            for j, nib in enumerate((b & 15, b >> 4)):
                want = math.nan if c == 255 else torch.tensor(vals[nib] * 2.0 ** (c - 127)).to(dtype).item()
                g = got[c, b, j].item()
                assert (math.isnan(g) and math.isnan(want)) or (g == want and math.copysign(1, g) == math.copysign(1, want)), (c, b, j)
