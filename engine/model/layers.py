"""Small building blocks: RMSNorm and DeepSeek-V3 rotary embedding with YaRN."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

from k2bench.engine.model.config import RopeConfig, yarn_get_mscale
from k2bench.engine.model.parallel import TensorSpec, float_spec, replicated_param


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = replicated_param((dim,), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

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

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dev = positions.device
        if dev not in self._inv_freq:
            self._inv_freq[dev] = self._inv_freq_cpu.to(dev)
        freqs = positions.float().unsqueeze(-1) * self._inv_freq[dev]  # [T, d/2]
        return freqs.cos() * self.mscale, freqs.sin() * self.mscale

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        if self.interleave:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        else:
            half = self.dim // 2
            x1, x2 = xf[..., :half], xf[..., half:]
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return out.to(x.dtype)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._cos_sin(positions)
        q = self._rotate(q, cos.unsqueeze(1), sin.unsqueeze(1))
        k = self._rotate(k, cos, sin)
        return q, k
