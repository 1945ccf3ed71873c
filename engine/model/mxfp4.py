"""OCP Microscaling MXFP4: E2M1 elements with one E8M0 scale per 32 along K.

Layout (the one AMD Quark exports and aiter / Triton `tl.dot_scaled` consume): a linear
weight W [N, K] is stored as a packed uint8 tensor [N, K/2] -- two E2M1 codes per byte,
the lower K index in the low nibble -- and a uint8 E8M0 scale tensor [N, K/32].

Shared-scale rules (selectable with `scale_rule=`; all keep the scale a power of two):
- ``"ocp"``   the OCP MX v1.0 rule: e = floor(log2(amax)) - 2. Values above 6 * 2^e saturate.
- ``"even"``  Quark's ``scale_calculation_mode: even``: amax is first rounded to the nearest
              power of two at E2M1 mantissa precision (add 2^21 to its float32 bits, clear the
              mantissa), then the OCP rule is applied. This avoids the large saturation error
              the plain floor rule has for blocks whose amax sits just below a power of two.
- ``"ceil"``  aiter's default: the smallest power of two >= amax / 6 (never saturates).
The default is ``"even"``, the rule the Kimi-K2.5 MXFP4 checkpoint was exported with.

Element rounding is round-to-nearest, ties to even, saturating at +-6. A block whose amax is
not finite gets the NaN scale 0xFF (and decodes to NaN); an all-zero block gets scale code 0.
"""

from __future__ import annotations

import torch

BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 0xFF
SCALE_RULES = ("ocp", "even", "ceil")
DEFAULT_SCALE_RULE = "even"

# Code -> value for the 16 E2M1 codes; bit 3 is the sign.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

_LUT_CACHE: dict[tuple, torch.Tensor] = {}


def _lut(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    key = (device, dtype)
    if key not in _LUT_CACHE:
        _LUT_CACHE[key] = torch.tensor(FP4_VALUES, dtype=dtype, device=device)
    return _LUT_CACHE[key]


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round already-scaled values to E2M1 codes (uint8 0..15): nearest, ties to even, saturating."""
    a = x.abs().float()
    # Midpoints between neighbouring magnitudes 0,.5,1,1.5,2,3,4,6. At a tie we move to the code
    # with an even mantissa: ">" keeps the lower (even) code, ">=" moves up to the even one.
    code = (
        (a > 0.25).to(torch.uint8)
        + (a >= 0.75)
        + (a > 1.25)
        + (a >= 1.75)
        + (a > 2.5)
        + (a >= 3.5)
        + (a > 5.0)
    ).to(torch.uint8)
    sign = torch.signbit(x).to(torch.uint8) << 3
    return code | sign


def e2m1_decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return _lut(codes.device, dtype)[codes.long()]


def e8m0_to_float(scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """E8M0 codes (uint8) -> 2^(e-127) as `dtype`; 0xFF -> NaN."""
    s = scale.to(torch.int32)
    out = torch.exp2((s - E8M0_BIAS).float())
    out = torch.where(s == E8M0_NAN, torch.full_like(out, float("nan")), out)
    return out.to(dtype)


def _as_uint8(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.uint8:
        return t
    if t.element_size() == 1:  # e.g. float8_e8m0fnu as some exporters store scales
        return t.view(torch.uint8)
    raise TypeError(f"expected a uint8 (E8M0 / packed FP4) tensor, got {t.dtype}")


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes; element 2i in the low nibble, 2i+1 in the high nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"last dim {codes.shape[-1]} is odd; cannot pack two FP4 codes per byte")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] codes (uint8 0..15)."""
    p = _as_uint8(packed)
    out = torch.stack((p & 0x0F, p >> 4), dim=-1)
    return out.reshape(*p.shape[:-1], p.shape[-1] * 2)


def shared_exponent(amax: torch.Tensor, rule: str = DEFAULT_SCALE_RULE) -> torch.Tensor:
    """Unbiased shared exponent (int32) per block from the block's amax (float32)."""
    if rule not in SCALE_RULES:
        raise ValueError(f"unknown MXFP4 scale rule {rule!r}; valid: {', '.join(SCALE_RULES)}")
    a = amax.float()
    tiny = torch.finfo(torch.float32).tiny
    safe = torch.where(a > 0, a, torch.full_like(a, tiny))
    if rule == "ocp":
        e = torch.floor(torch.log2(safe)) - 2
    elif rule == "even":
        bits = safe.view(torch.int32)
        rounded = ((bits + (1 << 21)) & -(1 << 23)).view(torch.float32)  # keep sign+exponent
        e = torch.floor(torch.log2(rounded)) - 2
    else:  # ceil: smallest 2^e with amax / 2^e <= 6
        e = torch.ceil(torch.log2(safe / 6.0))
    e = torch.where(a > 0, e, torch.full_like(e, -E8M0_BIAS))
    return e.clamp(-E8M0_BIAS, E8M0_BIAS).to(torch.int32)


def quantize_mxfp4(
    x: torch.Tensor, scale_rule: str = DEFAULT_SCALE_RULE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise x [..., K] (K % 32 == 0) to (packed uint8 [..., K/2], E8M0 scales uint8 [..., K/32])."""
    k = x.shape[-1]
    if k % BLOCK:
        raise ValueError(f"MXFP4 needs the last dim to be a multiple of {BLOCK}, got {k}")
    xb = x.float().reshape(*x.shape[:-1], k // BLOCK, BLOCK)
    amax = xb.abs().amax(dim=-1)
    finite = torch.isfinite(amax)
    e = shared_exponent(torch.where(finite, amax, torch.zeros_like(amax)), scale_rule)
    scaled = xb / torch.exp2(e.float()).unsqueeze(-1)
    codes = e2m1_encode(scaled)
    codes = torch.where(finite.unsqueeze(-1), codes, torch.zeros_like(codes))
    scale = (e + E8M0_BIAS).to(torch.uint8)
    scale = torch.where(finite, scale, torch.full_like(scale, E8M0_NAN))
    return pack_fp4(codes.reshape(*x.shape[:-1], k)), scale


def _byte_lut(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[256, 2]: the two E2M1 values (low nibble first) of every byte, so decoding is one gather."""
    key = (device, dtype, "byte")
    if key not in _LUT_CACHE:
        b = torch.arange(256, device=device)
        _LUT_CACHE[key] = torch.stack((_lut(device, dtype)[b & 0x0F], _lut(device, dtype)[b >> 4]), dim=-1)
    return _LUT_CACHE[key]


def _scaled_byte_lut(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[256 * 256, 2]: row (scale code << 8 | byte) holds the byte's two E2M1 values times 2^(code - 127),

    computed in float32 and then cast to `dtype` (the same rounding as decoding, scaling and casting
    separately), so dequantisation is a single gather with no per-element multiply or cast.
    """
    key = (device, dtype, "scaled")
    if key not in _LUT_CACHE:
        codes = torch.arange(256, device=device).to(torch.uint8)
        table = _byte_lut(device, torch.float32).unsqueeze(0) * e8m0_to_float(codes).view(256, 1, 1)
        _LUT_CACHE[key] = table.reshape(256 * 256, 2).to(dtype).contiguous()
    return _LUT_CACHE[key]


def dequantize_mxfp4(
    packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(packed [..., K/2], scales [..., K/32]) -> values [..., K] in `dtype` (exact: every product is representable)."""
    p = _as_uint8(packed)
    k = p.shape[-1] * 2
    sc = _as_uint8(scale)
    if sc.shape[-1] * BLOCK != k or sc.shape[:-1] != p.shape[:-1]:
        raise ValueError(f"MXFP4 scale shape {tuple(sc.shape)} does not match packed {tuple(packed.shape)}")
    # one int32 index per byte: its block's scale code in bits 8..15, the byte itself in bits 0..7
    idx = (sc.to(torch.int32).unsqueeze(-1) << 8).expand(*sc.shape, BLOCK // 2).reshape(-1) | p.reshape(-1)
    return _scaled_byte_lut(p.device, dtype).index_select(0, idx).reshape(*p.shape[:-1], k)


def fake_quantize_mxfp4(x: torch.Tensor, scale_rule: str = DEFAULT_SCALE_RULE) -> torch.Tensor:
    """Quantise-dequantise per 32 along the last dim (the A4W4 activation numerics), in x's dtype.

    Same result as dequantize(quantize(x)), computed without codes: on the E2M1 grid the spacing is
    0.5 below 2, 1 in [2, 4) and 2 above, so rounding is torch.round (half to even) at that spacing,
    and the even neighbour is always the even code.
    """
    k = x.shape[-1]
    if k % BLOCK:
        raise ValueError(f"MXFP4 needs the last dim to be a multiple of {BLOCK}, got {k}")
    xb = x.float().reshape(*x.shape[:-1], k // BLOCK, BLOCK)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    finite = torch.isfinite(amax)
    scale = torch.exp2(shared_exponent(torch.where(finite, amax, torch.zeros_like(amax)), scale_rule).float())
    m = (xb / scale).abs()
    q = torch.where(m < 2, torch.round(m * 2) * 0.5, torch.where(m < 4, torch.round(m), torch.round(m * 0.5) * 2))
    q = torch.copysign(q.clamp(max=6.0), xb) * scale
    q = torch.where(finite, q, torch.full_like(q, float("nan")))
    return q.reshape(x.shape).to(x.dtype)
