"""E2M1 decode of the fast layout's word packing (`moe_fast_layout.WORD_BITS`) straight into the wgmma
register operand.

Why: with nibble halves a thread loads two bytes at a time and spends 9 instructions per 4 values
(a byte permute, then mask, multiply, mask and a bf16x2 multiply per half). A word holds the eight values
of one row that a thread's A fragment needs (one scale group), so the tile comes in as [BN, 8] int32
(an 8-byte shared-memory load gives a thread both of its words), and each bf16x2 register is one to three
integer ops and the scale multiply. `words_to_operand` assembles the eight [BN, 8] outputs into the
chunk's two [BN, 32] halves with join / permute / reshape / split only: Triton maps that back onto the load's register layout,
so no value moves between threads or through shared memory (checked in the sm_90 TTGIR: the local_load
of the words feeds the warp_group_dot with no convert_layout).
"""

from __future__ import annotations

import triton
import triton.language as tl

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
def words_to_operand(w, e, BN: tl.constexpr, INTERPRET: tl.constexpr, ASM: tl.constexpr):
    """Words [BN, 8] (int32, word 2q + h) and E8M0 codes [BN, 8] (each word's group) -> the chunk's two
    scale groups' values [BN, 32] each, in k order (bf16; float32 under the interpreter). ASM: the
    inline-PTX decode."""
    if INTERPRET:
        sc = ((e.to(tl.uint32) + 126) << 23).to(tl.float32, bitcast=True)
    else:
        sc = ((e.to(tl.uint16) + 126) << 7).to(tl.bfloat16, bitcast=True)
    if ASM and not INTERPRET:
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
