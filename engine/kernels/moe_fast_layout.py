"""The fast MoE's weight layout, built once at load time from the checkpoint's packed MXFP4 experts.

Why: on GPUs without FP4 units `tl.dot_scaled` decodes every E2M1 element through an upcast, a scale
broadcast, a multiply, a NaN select and a register layout conversion; at decode sizes that, not the
bytes, set the MoE's time (bench/results/2026-11-30_h200_engine). Here the weights are re-laid out
once (`relayout_experts`) so that the decode is cheap and needs no reshuffling:

- K is cut into chunks of 64, two scale groups each; chunks are the outer dimension ([E, K/64, N, 32]
  bytes, [E, K/64, N, 2] scales): one program's tile of a chunk is a single contiguous run of rows x 32
  bytes, which a tensor descriptor reads as [rows, 8] 32-bit words.
- The 32 bytes of a row's chunk are eight 32-bit words whose bits land in the wgmma register operand
  with a few integer ops each. A thread's A fragment of a row holds, for its q = lane % 4, the
  k = 32h + 16s + 8c + 2q + l (s, c, l in {0, 1}): eight values of one scale group h, as four bf16x2
  registers (pair j = 2s + c, lane l = the register's 16-bit half). Word 2q + h of the row holds exactly
  those eight codes, code bit b of pair j at bit WORD_BITS[j][b] + 16 l, so one 8-byte shared-memory
  load gives a thread both of its words and each pair comes out as `(w << 6) & M`, `((w & m) * 18) & M`,
  `w & M` or `(((w >> 10) & m) * 0x8020) & M` (M = 0x81C081C0: sign at 15, magnitude at 6-8 of each
  half; the positions were found by a search over shift, mask and multiply programs, and the multiplies'
  shifted copies never overlap, so no carry reaches a kept bit): 10 integer ops per 8 values.
  `triton_moe_fast.words_to_operand` decodes them. (An earlier layout of nibble halves, one scale group
  per half of a byte, took 14 with its byte permutes and measured 5-13% slower; `moe_dispatch`.)
- Decode: (sign << 15) | ((code & 7) << 6) is, as bf16 bits, the E2M1 value times 2^-126 (codes 0
  and 1, i.e. 0 and 0.5, land on bf16's subnormals); the 2^126 is folded into the scale, so
  bf16(2^(e-1)) built from the E8M0 code e as ((e + 126) << 7) gives value = bits * scale in one
  exact multiply. bf16 holds 2^(e-1) up to e = 128 (weights up to 12); `relayout_experts` refuses
  larger scales (the caller keeps the checkpoint layout) and the NaN code 0xFF.
- Back: `unrelayout` rebuilds one expert's checkpoint bytes from the layout (exact), so a dense MLP
  kept only in this layout can still be dequantised for a BLAS GEMM at prefill sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from k2bench.engine.model.mxfp4 import BLOCK, E8M0_NAN

CHUNK = 64  # K values per relaid chunk: two scale groups, one per nibble half
MAX_SCALE_CODE = 128  # 2^(e-1) must stay a normal bf16
# bit of each E2M1 code bit (magnitude bits 0-2, sign 3) in a 16-bit half of a word, per pair j = 2s + c
WORD_BITS = ((0, 1, 2, 9), (5, 3, 4, 14), (6, 7, 8, 15), (11, 12, 13, 10))


class ScaleRangeError(ValueError):
    """An expert's E8M0 scales fall outside what the fast layout's bf16 decode can hold."""


class NanScaleError(ScaleRangeError):
    """The E8M0 NaN code 0xFF, which no checkpoint written by the engine holds: refused at load."""


@dataclass(frozen=True)
class FastExperts:
    """One layer's experts in the fast layout; `k13`/`k2` are the true (unpadded) K of each GEMM."""

    w13: torch.Tensor  # uint8 [E, H/64, 2L, 32]: per row and chunk the eight WORD_BITS words
    s13: torch.Tensor  # uint8 [E, H/64, 2L, 2]
    w2: torch.Tensor  # uint8 [E, L/64, H, 32]
    s2: torch.Tensor  # uint8 [E, L/64, H, 2]
    hidden: int
    inter: int


def _pack_words(codes: torch.Tensor) -> torch.Tensor:
    """Codes [N, chunks, 64] in k order -> [N, chunks, 32] bytes of the eight WORD_BITS words per chunk."""
    n, chunks, _ = codes.shape
    c = codes.to(torch.int64).view(n, chunks, 2, 2, 2, 4, 2)  # k = 32h + 16s + 8c + 2q + l
    word = torch.zeros(n, chunks, 2, 4, dtype=torch.int64, device=codes.device)  # [.., h, q]
    for s in range(2):
        for cc in range(2):
            for lane in range(2):
                v = c[:, :, :, s, cc, :, lane]
                for b, pos in enumerate(WORD_BITS[2 * s + cc]):
                    word |= ((v >> b) & 1) << (pos + 16 * lane)
    word = word.transpose(2, 3).reshape(n, chunks, 8)  # word 2q + h
    word = torch.where(word >= 1 << 31, word - (1 << 32), word)  # as int32 bits
    return word.to(torch.int32).view(torch.uint8).view(n, chunks, 32)  # little-endian words


def _relayout(w: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint [E, N, K/2] + [E, N, K/32] -> [E, Kp/64, N, 32] + [E, Kp/64, N, 2], Kp = K padded to 64
    with zero codes; one expert at a time, so the unpacked codes never exist for the whole stack."""
    E, N, half = w.shape
    k = 2 * half
    chunks = triton.cdiv(k, CHUNK)
    wf = torch.empty(E, chunks, N, CHUNK // 2, dtype=torch.uint8, device=w.device)
    sf = torch.empty(E, chunks, N, CHUNK // BLOCK, dtype=torch.uint8, device=w.device)
    for e in range(E):
        codes = torch.zeros(N, chunks * CHUNK, dtype=torch.uint8, device=w.device)
        codes[:, 0:k:2] = w[e] & 15
        codes[:, 1:k:2] = w[e] >> 4
        wf[e] = _pack_words(codes.view(N, chunks, CHUNK)).transpose(0, 1)
        groups = torch.full((N, chunks * 2), 127, dtype=torch.uint8, device=w.device)
        groups[:, : k // BLOCK] = s[e]  # group g of chunk c is column 2c + g
        sf[e] = groups.view(N, chunks, 2).transpose(0, 1)
    return wf, sf


def relayout_experts(w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor) -> FastExperts:
    """Re-lay a layer's packed experts (checkpoint layout, see triton_moe) for `fused_moe_fast`.

    Raises NanScaleError for the code 0xFF, ScaleRangeError above MAX_SCALE_CODE (one host sync: load time).
    """
    for name, s in (("w13_scale", s13), ("w2_scale", s2)):
        top = int(s.max()) if s.numel() else 0
        if top == E8M0_NAN:
            raise NanScaleError(f"{name} holds the E8M0 NaN code 0xFF")
        if top > MAX_SCALE_CODE:
            raise ScaleRangeError(f"{name} holds scale 2^{top - 127}, above the fast layout's 2^{MAX_SCALE_CODE - 127}")
    f13, g13 = _relayout(w13, s13)
    f2, g2 = _relayout(w2, s2)
    return FastExperts(f13, g13, f2, g2, hidden=2 * w13.shape[2], inter=w13.shape[1] // 2)


@triton.jit
def _unrelayout_kernel(wf_ptr, sf_ptr, table_ptr, w_ptr, s_ptr, N, HALF, GROUPS, BN: tl.constexpr, CB: tl.constexpr,
                       CG: tl.constexpr):
    """One chunk of BN rows back to checkpoint bytes: byte p of the chunk (codes k = 2p, 2p + 1) sits in
    word table[p], code bit b at bit table[32 (b + 1) + p] of the word's low half (k even) or high half. CB / CG:
    bytes / scale groups per chunk (module globals are not visible to a compiled kernel, only to the interpreter)."""
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    c = tl.program_id(1)
    p = tl.arange(0, CB)
    ok = rn < N
    word = tl.load(table_ptr + p)
    words = tl.load(wf_ptr + (c * N + rn[:, None]) * 8 + word[None, :], mask=ok[:, None], other=0)
    byte = tl.zeros((BN, CB), dtype=tl.int32)
    for b in tl.static_range(4):
        pos = tl.load(table_ptr + CB * (b + 1) + p)[None, :]
        byte |= ((words >> pos) & 1) << b
        byte |= ((words >> (pos + 16)) & 1) << (b + 4)
    col = c * CB + p
    tl.store(w_ptr + rn[:, None] * HALF + col[None, :], byte.to(tl.uint8), mask=ok[:, None] & (col < HALF)[None, :])
    g = tl.arange(0, CG)
    gcol = c * CG + g
    s = tl.load(sf_ptr + (c * N + rn[:, None]) * CG + g[None, :], mask=ok[:, None], other=0)
    tl.store(s_ptr + rn[:, None] * GROUPS + gcol[None, :], s, mask=ok[:, None] & (gcol < GROUPS)[None, :])


_TABLES: dict[torch.device, torch.Tensor] = {}


def _word_table(device: torch.device) -> torch.Tensor:
    """int32 [5, 32]: per byte p = 16h + 8s + 4c + q of a chunk, its word 2q + h, then the bit of each of
    its codes' bits 0-3 in a word half (WORD_BITS of pair 2s + c)."""
    if device not in _TABLES:
        p = torch.arange(CHUNK // 2)
        h, s, c, q = p >> 4, (p >> 3) & 1, (p >> 2) & 1, p & 3
        bits = torch.tensor(WORD_BITS)[2 * s + c]  # [32, 4]
        _TABLES[device] = torch.cat([(2 * q + h)[None], bits.T]).to(torch.int32).contiguous().to(device)
    return _TABLES[device]


def unrelayout(wf: torch.Tensor, sf: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's fast layout ([K/64, N, 32] words + [K/64, N, 2] scales) back to the checkpoint layout
    (packed [N, k/2] + scales [N, k/32], the chunk padding dropped): the exact inverse of `_relayout`, so a
    caller that keeps only the fast copy can still dequantise it for a BLAS GEMM (prefill-size batches)."""
    chunks, n, _ = wf.shape
    if k % BLOCK or triton.cdiv(k, CHUNK) != chunks:
        raise ValueError(f"K={k} does not fit a fast layout of {chunks} chunks")
    w = torch.empty(n, k // 2, dtype=torch.uint8, device=wf.device)
    s = torch.empty(n, k // BLOCK, dtype=torch.uint8, device=wf.device)
    if n:
        bn = 64
        _unrelayout_kernel[(triton.cdiv(n, bn), chunks)](
            wf.contiguous().view(torch.int32), sf.contiguous(), _word_table(wf.device), w, s, n, k // 2,
            k // BLOCK, BN=bn, CB=CHUNK // 2, CG=CHUNK // BLOCK)
    return w, s
