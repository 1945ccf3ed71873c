"""Triton backend: MXFP4 GEMMs through `tl.dot_scaled` (packed E2M1 weights + E8M0 scales, read as stored).

W4 mode feeds activations as bf16 (`lhs_format="bf16"`); A4W4 mode quantises them per 32 along K
(the engine's quantiser, default scale rule) and feeds packed E2M1 + E8M0 on both sides. Where the
hardware has no FP4 units (Hopper, CPU interpreter) Triton upcasts to bf16 inside the kernel.
Float weights, attention and routing are inherited from the torch backend; the MoE experts call
`linear`, so their MXFP4 matmuls run here too.

Runs on a GPU, or on CPU under TRITON_INTERPRET=1 (set before this module is imported), which is
how the tests exercise it. Only what was run is claimed: see engine/README.md.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from k2bench.engine.kernels import BackendError
from k2bench.engine.kernels.torch_backend import TorchBackend
from k2bench.engine.mxfp4 import BLOCK, quantize_mxfp4


@triton.jit
def _mxfp4_gemm(
    x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr,
    M, N, K,
    s_xm, s_xk, s_xsm, s_xsk, s_wn, s_wk, s_wsn, s_wsk, s_ym, s_yn,
    A_FP4: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """y[M, N] = x[M, K] @ dequant(w)[N, K]^T; w packed [N, K/2] (low nibble first), scales [N, K/32]."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
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


def mxfp4_matmul(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *, a4w4: bool) -> torch.Tensor:
    """x [..., K] @ MXFP4 weight [N, K/2] (+ scales [N, K/32])^T -> [..., N] in x's dtype."""
    lead = x.shape[:-1]
    k = x.shape[-1]
    n = weight.shape[0]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    if a4w4:
        xa, xs = quantize_mxfp4(x2)
    else:
        xa, xs = x2.to(torch.bfloat16).contiguous(), torch.empty(1, 1, dtype=torch.uint8, device=x.device)
    bm = 16 if m <= 16 else (32 if m <= 32 else 64)
    bn = 64 if n >= 64 else 32
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _mxfp4_gemm[grid](
        xa, xs, weight, weight_scale, y,
        m, n, k,
        xa.stride(0), xa.stride(1), xs.stride(0), xs.stride(1),
        weight.stride(0), weight.stride(1), weight_scale.stride(0), weight_scale.stride(1),
        y.stride(0), y.stride(1),
        A_FP4=a4w4, BM=bm, BN=bn, BK=_block_k(k),
    )
    return y.reshape(*lead, n)


class TritonBackend(TorchBackend):
    name = "triton"

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(device)
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise BackendError("the triton backend needs a GPU, or TRITON_INTERPRET=1 on CPU (tests only)")

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None, *, a4w4: bool = False
    ) -> torch.Tensor:
        if weight_scale is None:
            return F.linear(x, weight)
        return mxfp4_matmul(x, weight, weight_scale, a4w4=a4w4)
