"""Small building blocks: RMSNorm and DeepSeek-V3 rotary embedding with YaRN.

The modules hold parameters and tables; the arithmetic runs in the backend (`rms_norm`, and rope as part
of `mla_rope_cache`), so the triton backend can fuse it with its neighbours. The torch functions here are
the reference the backends are checked against.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

from k2bench.engine.model.config import RopeConfig, yarn_get_mscale
from k2bench.engine.model.parallel import Parallel, TensorSpec, float_spec, replicated_param


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as DeepSeek-V3 computes it: statistics in float32, the weight applied in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate x [..., d] by cos/sin [..., d/2] in float32: pairs (x[2i], x[2i+1]) or halves; x's dtype out."""
    xf = x.float()
    if interleave:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        half = x.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, par: Parallel) -> None:
        super().__init__()
        self.eps = eps
        self.par = par
        self.weight = replicated_param((dim,), par.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, quantize: bool = False):
        """norm(x); with `residual`, (norm(x + residual), x + residual): the add fused into the norm; with
        `quantize` too, a third output: the norm's MXFP4 fake-quantised values, for an A4W4 GEMM next."""
        return self.par.backend.rms_norm(x, self.weight, self.eps, residual, quantize)

    def specs(self, name: str) -> Iterator[TensorSpec]:
        yield float_spec(f"{name}.weight", self.weight)


def yarn_inv_freq(dim: int, rope: RopeConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin magnitude factor, as DeepSeek-V3's YaRN rotary does it.

    Dimensions that rotate more than beta_fast times over the original context keep their
    frequency (extrapolation), those rotating fewer than beta_slow times are divided by `factor`
    (interpolation), with a linear ramp between. cos/sin are multiplied by
    mscale(factor, mscale) / mscale(factor, mscale_all_dim).
    """
    base = rope.theta
    freq_extra = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim))
    if rope.kind != "yarn":
        return freq_extra, 1.0
    freq_inter = freq_extra / rope.factor

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(rope.original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low = max(math.floor(correction_dim(rope.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rope.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # 1: keep the original (extrapolated) frequency
    inv_freq = freq_inter * (1 - keep) + freq_extra * keep
    mscale = yarn_get_mscale(rope.factor, rope.mscale) / yarn_get_mscale(rope.factor, rope.mscale_all_dim)
    return inv_freq, float(mscale)


class Rotary(nn.Module):
    """Applies rope to [T, H, d] queries and [T, d] keys; interleaved pairs (x[2i], x[2i+1]) or halves.

    With `interleave` the output stays interleaved; the layout only has to agree between q and k
    (their dot product is what matters), and the cached key is produced here too.
    """

    def __init__(self, dim: int, rope: RopeConfig, interleave: bool) -> None:
        super().__init__()
        self.dim = dim
        self.rope = rope
        self.interleave = interleave
        inv_freq, self.mscale = yarn_inv_freq(dim, rope)
        self._inv_freq_cpu = inv_freq
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        """The float32 inverse frequencies [d/2] on `device` (copied there once; CUDA graphs keep the copy)."""
        if device not in self._inv_freq:
            self._inv_freq[device] = self._inv_freq_cpu.to(device)
        return self._inv_freq[device]

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, d/2] in float32, magnitude factor included."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq(positions.device)  # [T, d/2]
        return freqs.cos() * self.mscale, freqs.sin() * self.mscale

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(positions)
        return rope_reference(q, cos.unsqueeze(1), sin.unsqueeze(1), self.interleave), rope_reference(
            k, cos, sin, self.interleave)
