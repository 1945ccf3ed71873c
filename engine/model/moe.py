"""Dense MLP, the DeepSeek-V3 router (sigmoid + correction bias, group-limited top-k) and the MoE block.

TP: the dense MLP and every expert are split on their intermediate dimension (gate/up column
parallel, down row parallel); the MoE block sums routed experts and shared experts locally and
does a single all-reduce. The router is replicated and runs in float32.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from k2bench.engine.model.config import ModelConfig
from k2bench.engine.model.mxfp4 import BLOCK
from k2bench.engine.model.parallel import Linear, Parallel, TensorSpec, float_spec, replicated_param

if TYPE_CHECKING:
    from k2bench.engine.kernels.backend import KernelBackend


# set to 1: dense MLPs keep their checkpoint tensors at load even where the backend could release them
KEEP_DENSE_ENV = "K2BENCH_KEEP_DENSE_CHECKPOINT"


def _check_backend(prefix: str, released_for: KernelBackend | None, backend: KernelBackend, hint: str = "") -> None:
    """A module whose checkpoint tensors were released at load runs only on the backend that kept its copy."""
    if released_for is not None and backend is not released_for:
        raise RuntimeError(f"{prefix}: the checkpoint layout of these weights was released at load, only the "
                           f"{released_for.name} backend's own layout is left; load the model with backend='torch'"
                           f"{hint} to switch backends afterwards")


class DenseMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, par: Parallel, prefix: str, intermediate: int, *, reduce: bool) -> None:
        super().__init__()
        self.prefix = prefix
        self.par = par
        self.reduce = reduce
        self.released_for: KernelBackend | None = None  # the backend left with the only copy (see `prepare`)
        q = cfg.quant
        quant = q is not None and q.is_quantized(f"{prefix}.gate_proj")
        if q is not None and quant != q.is_quantized(f"{prefix}.up_proj"):
            raise ValueError(f"{prefix}: gate_proj and up_proj must share one quantisation scheme")
        self.gate_up = Linear(
            cfg.hidden_size, 2 * intermediate, par, tp_dim=0, quantized=quant,
            out_splits=(intermediate, intermediate), name=f"{prefix}.gate_up",
        )
        self.down = Linear(
            intermediate, cfg.hidden_size, par, tp_dim=1,
            quantized=q is not None and q.is_quantized(f"{prefix}.down_proj"), name=f"{prefix}.down_proj",
        )

    def specs(self) -> Iterator[TensorSpec]:
        yield from self.gate_up.specs(f"{self.prefix}.gate_proj", 0)
        yield from self.gate_up.specs(f"{self.prefix}.up_proj", 1)
        yield from self.down.specs(f"{self.prefix}.down_proj")

    @property
    def takes_quantized(self) -> bool:
        """Whether the input may come already A4W4-quantised (`forward`'s xq): the first GEMM is MXFP4."""
        return self.par.a4w4 and self.gate_up.quantized

    def prepare(self) -> None:
        """After loading, as `Experts.prepare`: when the backend will serve every batch size from its own
        layout of this MLP, the checkpoint tensors are emptied in place, so the MLP is held once.
        K2BENCH_KEEP_DENSE_CHECKPOINT=1 in the environment keeps them (the backend's layout is then built on
        first use, beside them, as before), e.g. to compare memory or to swap backends afterwards."""
        if os.environ.get(KEEP_DENSE_ENV, "").strip() == "1":
            return
        gu, down = self.gate_up, self.down
        params = (gu.weight, gu.weight_scale, down.weight, down.weight_scale)
        if self.par.backend.prepare_dense(*params):
            for p in params:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            self.released_for = self.par.backend

    def forward(self, x: torch.Tensor, xq: torch.Tensor | None = None) -> torch.Tensor:
        """xq: x's A4W4 values, when the norm before wrote them (`takes_quantized`)."""
        y = self.local(x, xq)
        return self.par.all_reduce(y) if self.reduce else y

    def local(self, x: torch.Tensor, xq: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's share of `forward` (before any all-reduce)."""
        _check_backend(self.prefix, self.released_for, self.par.backend, f" (or with {KEEP_DENSE_ENV}=1)")
        gu, down = self.gate_up, self.down
        return self.par.backend.dense_mlp(x if xq is None else xq, gu.weight, gu.weight_scale, down.weight,
                                          down.weight_scale, a4w4=self.par.a4w4, x_quantized=xq is not None)


class Router(nn.Module):
    def __init__(self, cfg: ModelConfig, par: Parallel, prefix: str) -> None:
        super().__init__()
        self.cfg = cfg
        self.par = par
        self.prefix = prefix
        self.weight = replicated_param((cfg.n_routed_experts, cfg.hidden_size), torch.float32)
        self.e_score_correction_bias = replicated_param((cfg.n_routed_experts,), torch.float32)

    def specs(self) -> Iterator[TensorSpec]:
        yield float_spec(f"{self.prefix}.weight", self.weight)
        yield float_spec(f"{self.prefix}.e_score_correction_bias", self.e_score_correction_bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (topk_weights float32 [T, k], topk_ids int64 [T, k])."""
        cfg = self.cfg
        scores = F.linear(x.float(), self.weight).sigmoid()
        return self.par.backend.route_experts(
            scores, self.e_score_correction_bias, top_k=cfg.num_experts_per_tok, n_group=cfg.n_group,
            topk_group=cfg.topk_group, renormalize=cfg.norm_topk_prob, scale=cfg.routed_scaling_factor,
        )


class Experts(nn.Module):
    """All routed experts of a layer, stacked: w13 [E, 2*I/tp, H] (gate rows then up rows), w2 [E, H, I/tp]."""

    def __init__(self, cfg: ModelConfig, par: Parallel, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.par = par
        E, H, inter = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        if inter % par.size:
            raise ValueError(f"moe_intermediate_size {inter} is not divisible by tp={par.size}")
        self.E, self.H, self.inter, self.local = E, H, inter, inter // par.size
        self.released_for: KernelBackend | None = None  # the backend left with the only copy (see `prepare`)
        q = cfg.quant
        self.quantized = q is not None and q.is_quantized(f"{prefix}.0.gate_proj")
        if q is not None and not all(
            q.is_quantized(f"{prefix}.0.{n}") == self.quantized for n in ("up_proj", "down_proj")
        ):
            raise ValueError(f"{prefix}: gate/up/down projections must share one quantisation scheme")
        L = self.local
        if self.quantized:
            if L % BLOCK:
                raise ValueError(
                    f"{prefix}: MXFP4 experts need moe_intermediate_size/tp ({L}) to be a multiple of {BLOCK}"
                )
            self.w13 = replicated_param((E, 2 * L, H // 2), torch.uint8)
            self.w13_scale = replicated_param((E, 2 * L, H // BLOCK), torch.uint8)
            self.w2 = replicated_param((E, H, L // 2), torch.uint8)
            self.w2_scale = replicated_param((E, H, L // BLOCK), torch.uint8)
        else:
            self.w13 = replicated_param((E, 2 * L, H), par.dtype)
            self.w2 = replicated_param((E, H, L), par.dtype)
            self.w13_scale = self.w2_scale = None

    def shard_part(self, param: nn.Parameter, which: str) -> tuple[int, int, int]:
        """(dim, start, length) of one expert's full gate/up/down tensor that this rank keeps."""
        r = self.par.rank
        if which in ("gate", "up"):
            rows = param.shape[1] // 2
            return (0, r * rows, rows)
        cols = param.shape[2]
        return (1, r * cols, cols)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, expert: int, which: str, *, narrowed: bool = False
    ) -> None:
        """Place expert `expert`'s gate/up/down tensor (full, or this rank's part if `narrowed`) in the stack."""
        src = loaded if narrowed else loaded.narrow(*self.shard_part(param, which))
        if which in ("gate", "up"):
            rows = param.shape[1] // 2
            dst = param.data[expert].narrow(0, 0 if which == "gate" else rows, rows)
        else:
            dst = param.data[expert]
        if src.shape != dst.shape:
            raise ValueError(f"shard shape {tuple(src.shape)} != {tuple(dst.shape)}")
        dst.copy_(src if param.dtype == torch.uint8 else src.to(param.dtype))

    def specs(self) -> Iterator[TensorSpec]:
        H, inter = self.H, self.inter
        for e in range(self.E):
            for which, shape in (("gate", (inter, H)), ("up", (inter, H)), ("down", (H, inter))):
                name = f"{self.prefix}.{e}.{which}_proj"
                w, s = (self.w2, self.w2_scale) if which == "down" else (self.w13, self.w13_scale)
                if self.quantized:
                    tensors = [("weight", w, (shape[0], shape[1] // 2), "uint8"),
                               ("weight_scale", s, (shape[0], shape[1] // BLOCK), "uint8")]
                else:
                    tensors = [("weight", w, shape, "float")]
                for suffix, param, full, kind in tensors:
                    yield TensorSpec(f"{name}.{suffix}", full, kind, param, self._bind(param, e, which),
                                     self.shard_part(param, which))

    def _bind(self, param: nn.Parameter, e: int, which: str):
        return lambda t: self.weight_loader(param, t, e, which, narrowed=True)

    def prepare(self) -> None:
        """After loading: let the backend build its own layout of these weights (once). When the backend
        says it will only read that layout, the checkpoint tensors are emptied in place (the parameters
        stay, so the backend still finds its copy by them), so the experts are not held twice."""
        params = (self.w13, self.w13_scale, self.w2, self.w2_scale)
        if self.par.backend.prepare_moe(*params):
            for p in params:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            self.released_for = self.par.backend

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, add: torch.Tensor | None = None,
        x_quantized: bool = False,
    ) -> torch.Tensor:
        """Routed experts' sum for each token, plus `add` (the shared experts' output) in the same pass;
        x_quantized: x already holds its A4W4 values."""
        _check_backend(self.prefix, self.released_for, self.par.backend)
        return self.par.backend.fused_moe(
            x, ids, weights, self.w13, self.w13_scale, self.w2, self.w2_scale, a4w4=self.par.a4w4, add=add,
            x_quantized=x_quantized,
        )


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, par: Parallel, prefix: str) -> None:
        super().__init__()
        self.par = par
        self.gate = Router(cfg, par, f"{prefix}.gate")
        self.experts = Experts(cfg, par, f"{prefix}.experts")
        self.shared_experts = (
            DenseMLP(cfg, par, f"{prefix}.shared_experts", cfg.moe_intermediate_size * cfg.n_shared_experts, reduce=False)
            if cfg.n_shared_experts
            else None
        )

    def specs(self) -> Iterator[TensorSpec]:
        yield from self.gate.specs()
        yield from self.experts.specs()
        if self.shared_experts is not None:
            yield from self.shared_experts.specs()

    @property
    def takes_quantized(self) -> bool:
        """Whether the input may come already A4W4-quantised: every expert GEMM that reads it is MXFP4."""
        shared = self.shared_experts
        return self.par.a4w4 and self.experts.quantized and (shared is None or shared.takes_quantized)

    def forward(self, x: torch.Tensor, xq: torch.Tensor | None = None) -> torch.Tensor:
        """x feeds the float32 router; xq (x's A4W4 values, when the norm before wrote them) the experts."""
        return self.par.all_reduce(self.local(x, xq))

    def local(self, x: torch.Tensor, xq: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's share of `forward` (before the all-reduce; a rank's warm-up runs it alone)."""
        weights, ids = self.gate(x)
        shared = self.shared_experts(x, xq) if self.shared_experts is not None else None
        return self.experts(x if xq is None else xq, weights, ids, shared, xq is not None)
