"""The word layout's decode kernel on its own, against the OCP E2M1 table: shared by the interpreted child of
test_triton_moe_fast.py (Triton integer ops) and its GPU test (inline PTX). Imported by name from this folder,
after TRITON_INTERPRET is set where it should be."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from k2bench.engine.kernels.moe_fast_layout import relayout_experts
from k2bench.engine.kernels.triton_moe_fast import word_scales, words_to_operand


@triton.jit
def _decode(w_ptr, s_ptr, lo_ptr, hi_ptr, INTERPRET: tl.constexpr):
    r = tl.arange(0, 256)
    c = tl.arange(0, 32)
    p = tl.load(w_ptr + r[:, None] * 8 + tl.arange(0, 8)[None, :])
    lo, hi = words_to_operand(p, word_scales(tl.load(s_ptr + r * 2), tl.load(s_ptr + r * 2 + 1), 256), 256, INTERPRET)
    tl.store(lo_ptr + r[:, None] * 32 + c[None, :], lo.to(tl.float32))
    tl.store(hi_ptr + r[:, None] * 32 + c[None, :], hi.to(tl.float32))


FP4_TABLE = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # OCP E2M1


def word_decode_check(device: str, interpret: bool) -> bool:
    """The kernels' word decode (`triton_moe_fast.words_to_operand`: inline PTX on a GPU, Triton integer ops
    under the interpreter) on every byte at every scale code the layout accepts (0..128, a different one
    for each row's two groups, so a swap of groups shows), against the OCP table written out here, signed
    zeros included. One chunk of 256 rows: a [256, 32]-byte checkpoint tile re-laid out by the loader."""
    packed = torch.arange(256, dtype=torch.uint8).view(8, 32).repeat(32, 1)  # 256 rows x 32 bytes (K = 64)
    up = torch.cat((torch.arange(129), torch.arange(127, 0, -1)))[:256].to(torch.uint8)
    scales = torch.stack((up, up.flip(0)), dim=1)  # [256, 2]: group 0 and group 1 of each row
    dummy_w, dummy_s = torch.zeros(1, 64, 64, dtype=torch.uint8), torch.full((1, 64, 4), 127, dtype=torch.uint8)
    fast = relayout_experts(packed[None], scales[None], dummy_w, dummy_s)  # rows = 2L = 256, H = 64
    words = fast.w13[0, 0].contiguous().view(torch.int32).to(device)  # [256, 8]
    codes = torch.stack((packed & 15, packed >> 4), dim=-1).view(256, 64).long()  # k = 2i low, 2i + 1 high
    want = torch.tensor(FP4_TABLE, dtype=torch.float64)[codes] * torch.exp2(
        scales.double().repeat_interleave(32, dim=1) - 127)
    lo = torch.empty(256, 32, device=device)
    hi = torch.empty(256, 32, device=device)
    _decode[(1,)](words, fast.s13[0, 0].contiguous().to(device), lo, hi, INTERPRET=interpret)
    got = torch.cat((lo, hi), dim=1).cpu()
    return torch.equal(got.double(), want) and torch.equal(torch.signbit(got), codes >= 8)
