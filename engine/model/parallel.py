"""Tensor parallelism: rank helpers, parallel linears (each owns its weight loader), all-reduce.

A linear's full weight is W [out, in]. `tp_dim=None` replicates it, `tp_dim=0` splits the output
rows (column parallel: heads, MLP intermediate), `tp_dim=1` splits the input columns (row parallel:
o_proj, down_proj; the caller all-reduces the partial sums). MXFP4 weights split the same way:
the packed bytes [out, in/2] and E8M0 scales [out, in/32] are narrowed along the same dim, so a
row-parallel MXFP4 split needs in/tp to be a multiple of 32.

Each parallel module owns `weight_loader(param, full_tensor, shard...)`, which knows the shard dim;
its `specs()` bind that loader to the checkpoint names it consumes (`TensorSpec`), and the
checkpoint loader only hands each tensor to the spec that names it. Specs are taken after the
model is materialised (`to_empty` replaces meta parameters, so nothing is stored on them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from k2bench.engine.model.allreduce import AllReduce
from k2bench.engine.model.mxfp4 import BLOCK

if TYPE_CHECKING:
    from k2bench.engine.kernels.backend import KernelBackend


@dataclass(frozen=True)
class Parallel:
    """Where this process sits in the tensor-parallel group, plus the numerics it runs with."""

    rank: int = 0
    size: int = 1
    dtype: torch.dtype = torch.float32
    a4w4: bool = False
    backend: KernelBackend | None = None  # the kernels every layer runs (None only before loading)
    # NCCL until the runtime sets up one-shot for small tensors (allreduce.py); shared by every layer
    reducer: AllReduce = field(default_factory=AllReduce, compare=False, repr=False)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the group in place (row-parallel partial sums); returns x."""
        if self.size > 1:
            return self.reducer(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last dim, in rank order (column-parallel outputs)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor the model expects: its full (unsharded) shape, kind and loader."""

    name: str
    shape: tuple[int, ...]
    kind: str  # "float" (any float dtype, cast on load) or "uint8" (packed FP4 / E8M0)
    param: nn.Parameter
    load: Callable[[torch.Tensor], None]  # takes the `part` of the tensor (the whole tensor if part is None)
    part: tuple[int, int, int] | None = None  # (dim, start, length) this rank keeps; read only that


def _default_loader(param: nn.Parameter, loaded: torch.Tensor, shard: object = None) -> None:
    if tuple(loaded.shape) != tuple(param.shape):
        raise ValueError(f"shape {tuple(loaded.shape)} != {tuple(param.shape)}")
    param.data.copy_(loaded.to(param.dtype))


def replicated_param(shape: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)


def float_spec(name: str, param: nn.Parameter) -> TensorSpec:
    return TensorSpec(name, tuple(param.shape), "float", param, lambda t: _default_loader(param, t))


class Linear(nn.Module):
    """y = x W^T, replicated or split over the TP group; float or MXFP4 weights.

    `out_splits` makes a merged column-parallel linear (e.g. gate_proj and up_proj in one
    matmul): each piece is split over the ranks on its own, and the local output is the
    concatenation of the local pieces.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        par: Parallel,
        *,
        tp_dim: int | None = None,
        quantized: bool = False,
        out_splits: tuple[int, ...] | None = None,
        name: str = "",
    ) -> None:
        super().__init__()
        self.par = par
        self.tp_dim = tp_dim
        self.quantized = quantized
        self.in_features = in_features
        self.out_splits = out_splits or (out_features,)
        if sum(self.out_splits) != out_features:
            raise ValueError(f"{name}: out_splits {self.out_splits} do not sum to {out_features}")
        n = par.size
        if tp_dim == 0:
            for s in self.out_splits:
                if s % n:
                    raise ValueError(f"{name}: output size {s} is not divisible by tp={n}")
            self.local_splits = tuple(s // n for s in self.out_splits)
            self.local_in = in_features
        elif tp_dim == 1:
            if in_features % n:
                raise ValueError(f"{name}: input size {in_features} is not divisible by tp={n}")
            self.local_splits = self.out_splits
            self.local_in = in_features // n
        else:
            self.local_splits = self.out_splits
            self.local_in = in_features
        out_l = sum(self.local_splits)
        if quantized:
            if self.local_in % BLOCK:
                raise ValueError(
                    f"{name}: MXFP4 needs the per-rank input size ({self.local_in}) to be a multiple of {BLOCK}"
                )
            self.weight = nn.Parameter(torch.empty(out_l, self.local_in // 2, dtype=torch.uint8), requires_grad=False)
            self.weight_scale = nn.Parameter(
                torch.empty(out_l, self.local_in // BLOCK, dtype=torch.uint8), requires_grad=False
            )
        else:
            self.weight = nn.Parameter(torch.empty(out_l, self.local_in, dtype=par.dtype), requires_grad=False)
            self.weight_scale = None

    def shard_part(self, param: nn.Parameter, shard: int | None = None) -> tuple[int, int, int] | None:
        """(dim, start, length) of the full checkpoint tensor that this rank keeps; None: all of it."""
        if self.tp_dim == 0:
            rows = self.local_splits[shard or 0]
            return (0, self.par.rank * rows, rows)
        if self.tp_dim == 1:
            cols = param.shape[1]  # packed bytes, scales or values: the local width of this tensor
            return (1, self.par.rank * cols, cols)
        return None

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard: int | None = None, *, narrowed: bool = False
    ) -> None:
        """Copy this rank's part of a checkpoint tensor (piece `shard` of a merged linear) into `param`.

        `loaded` is the full tensor, or already this rank's part when `narrowed` (the checkpoint
        loader reads only `shard_part` from disk)."""
        idx = shard or 0
        part = None if narrowed else self.shard_part(param, shard)
        t = loaded if part is None else loaded.narrow(*part)
        dst = param.data.narrow(0, sum(self.local_splits[:idx]), self.local_splits[idx])
        if t.shape != dst.shape:
            raise ValueError(f"shard shape {tuple(t.shape)} != {tuple(dst.shape)}")
        dst.copy_(t if param.dtype == torch.uint8 else t.to(param.dtype))

    def specs(self, ckpt_name: str, shard: int | None = None) -> Iterator[TensorSpec]:
        """The checkpoint tensors `<ckpt_name>.weight` (and `.weight_scale`) feeding piece `shard`."""
        rows = self.out_splits[shard or 0]
        tensors = [("weight", self.weight, self.in_features, "float")]
        if self.quantized:
            tensors = [("weight", self.weight, self.in_features // 2, "uint8"),
                       ("weight_scale", self.weight_scale, self.in_features // BLOCK, "uint8")]
        for suffix, param, cols, kind in tensors:
            yield TensorSpec(
                f"{ckpt_name}.{suffix}", (rows, cols), kind, param,
                self._bind(param, shard), self.shard_part(param, shard),
            )

    def _bind(self, param: nn.Parameter, shard: int | None) -> Callable[[torch.Tensor], None]:
        return lambda t: self.weight_loader(param, t, shard, narrowed=True)

    def dense_weight(self) -> torch.Tensor:
        """The local weight in the compute dtype (MXFP4 dequantised), for absorbed-attention algebra."""
        if self.quantized:
            from k2bench.engine.model.mxfp4 import dequantize_mxfp4

            return dequantize_mxfp4(self.weight, self.weight_scale, self.par.dtype)
        return self.weight

    def forward(self, x: torch.Tensor, *, x_quantized: bool = False) -> torch.Tensor:
        """x_quantized: x already holds A4W4's quantised values (the kernel before wrote them), so the
        backend skips quantising it again."""
        return self.par.backend.linear(x, self.weight, self.weight_scale, a4w4=self.par.a4w4, x_quantized=x_quantized)
