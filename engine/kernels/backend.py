"""The interface every kernel backend implements, so the model calls kernels through one typed door.

Declared as a `typing.Protocol`: a backend is any object with these ops, checked by type checkers and
by `tests/engine/kernels/test_backend_registry.py`, never probed at run time. Importing this module does
not import torch (the CLI lists backend names without the engine extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    import torch

    from k2bench.engine.model.attn_meta import AttentionMetadata


class BackendError(ValueError):
    """An unknown or unusable backend name."""


class AttentionPlan:
    """One step's attention plan: built once per forward by `plan_attention` (or `decode_plan`) and read by
    the same backend's `mla` in every layer. Opaque to the model; each backend subclasses it."""


class Rotary(Protocol):
    """What a backend uses of the model's rope (engine/model/layers.py's `Rotary` is one); declared here
    so that the kernels do not import the model's layers, which reach the kernels through `Parallel`."""

    mscale: float
    interleave: bool

    def inv_freq(self, device: torch.device) -> torch.Tensor: ...

    def __call__(self, positions: torch.Tensor, q: torch.Tensor,
                 k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class KernelBackend(Protocol):
    """The ops the model runs through its `Parallel.backend`."""

    name: ClassVar[str]
    # True when `decode_plan` is built from device tensors alone (no host sync, no data-dependent
    # shapes), so pure-decode steps can be captured in CUDA graphs.
    graph_decode: ClassVar[bool]

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None, *, a4w4: bool = False,
        x_quantized: bool = False,
    ) -> torch.Tensor:
        """y = x W^T. `weight_scale is None`: a float weight; otherwise packed MXFP4 [N, K/2] with E8M0
        scales [N, K/32]. a4w4 quantises the activations per 32 along K first, unless `x_quantized` says
        the kernel before already did (`rms_norm(quantize=True)`, `swiglu(quantize=True)`)."""
        ...

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
        quantize: bool = False,
    ):
        """RMSNorm of x's rows (`layers.rms_norm_reference`). With `residual`: h = x + residual rounded to x's
        dtype, returns (norm(h), h), so a decoder layer's residual add costs no pass of its own; with
        `quantize` too, (norm(h), h, fake_quantize_mxfp4(norm(h))), the next A4W4 GEMM's input."""
        ...

    def swiglu(self, x: torch.Tensor, quantize: bool = False) -> torch.Tensor:
        """silu(gate) * up of x = [gate | up] [T, 2I] in x's dtype (`F.silu(gate) * up`); with `quantize`
        then fake_quantize_mxfp4 of it, the down projection's A4W4 input."""
        ...

    def mla_rope_cache(
        self,
        q_pe: torch.Tensor,
        kv: torch.Tensor,
        positions: torch.Tensor,
        rotary: Rotary,
        norm_weight: torch.Tensor,
        eps: float,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        """MLA's step between the projections and attention: rope on q_pe [T, H, rope] (returned) and on the
        key half of kv [T, r + rope], RMSNorm (`norm_weight` [r]) on its latent half, and both written to the
        paged cache at `slot_mapping` (fp8 caches saturate)."""
        ...

    def fused_moe(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        w13: torch.Tensor,
        w13_scale: torch.Tensor | None,
        w2: torch.Tensor,
        w2_scale: torch.Tensor | None,
        *,
        a4w4: bool = False,
        add: torch.Tensor | None = None,
        x_quantized: bool = False,
    ) -> torch.Tensor:
        """Routed experts: SiLU-gated gate/up, down, weighted sum over each token's chosen experts (no
        all-reduce), in x's dtype; `add` [T, H] (the shared experts' output) is added as `out + add` would,
        so a backend can do it in the same pass. `x_quantized`: x already holds A4W4's quantised values."""
        ...

    def dense_mlp(
        self,
        x: torch.Tensor,
        w13: torch.Tensor,
        w13_scale: torch.Tensor | None,
        w2: torch.Tensor,
        w2_scale: torch.Tensor | None,
        *,
        a4w4: bool = False,
        x_quantized: bool = False,
    ) -> torch.Tensor:
        """down(silu(gate(x)) * up(x)) of one SwiGLU MLP on every token (a dense layer's MLP, the shared
        experts): w13 [2L, H] holds the gate rows then the up rows, w2 [H, L]; each is a float weight or
        packed MXFP4 with its scales, as in `linear` (no all-reduce). x_quantized: x already holds its
        A4W4 values."""
        ...

    def route_experts(
        self, scores: torch.Tensor, bias: torch.Tensor, *, top_k: int, n_group: int, topk_group: int,
        renormalize: bool, scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert choice from sigmoid scores float32 [T, E] and the correction bias [E] -> (weights
        float32 [T, k], ids int64 [T, k]), highest choice first."""
        ...

    def prepare_moe(
        self, w13: torch.Tensor, w13_scale: torch.Tensor | None, w2: torch.Tensor, w2_scale: torch.Tensor | None
    ) -> bool:
        """Called once per expert stack after loading: a backend may build its own weight layout here
        (raising BackendError for weights it cannot take). True when this backend's `fused_moe` will never
        read the checkpoint tensors again, so the caller may release them (one copy of the experts in
        memory); `fused_moe` still receives the same tensor objects."""
        ...

    def prepare_dense(
        self, w13: torch.Tensor, w13_scale: torch.Tensor | None, w2: torch.Tensor, w2_scale: torch.Tensor | None
    ) -> bool:
        """`prepare_moe` for one dense SwiGLU MLP (a dense layer's MLP, the shared experts), called once after
        loading: True when this backend's `dense_mlp` will serve every batch size from its own layout of these
        weights, so the caller may release the checkpoint tensors; `dense_mlp` still receives them."""
        ...

    def plan_attention(self, meta: AttentionMetadata, kv_dim: int) -> AttentionPlan:
        """The step's gather plan from the runner's metadata (may read it on the host)."""
        ...

    def warm_up_decode(self, w_uk: torch.Tensor, rope_dim: int, kv_cache: torch.Tensor, scale: float) -> int:
        """Run the decode attention once per compiled variant a step can meet (split or not), on a layer's
        paged cache (read, never written), in the calling thread. Returns the calls run (0: nothing to warm)."""
        ...

    def decode_plan(self, meta: AttentionMetadata, kv_dim: int) -> AttentionPlan:
        """The plan of a step where every sequence brings one token (sync-free when `graph_decode`)."""
        ...

    def mla(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        plan: AttentionPlan,
        scale: float,
        w_uk: torch.Tensor,
        w_uv: torch.Tensor,
    ) -> torch.Tensor:
        """One layer's attention: per-head values [T, H, v] from q_nope [T, H, nope], q_pe [T, H, rope],
        the paged latent cache and kv_b_proj's halves w_uk [H, nope, r] / w_uv [H, v, r]."""
        ...

    def warm_up_mla(self, w_uk: torch.Tensor, w_uv: torch.Tensor, rope_dim: int, max_ctx: int, scale: float) -> int:
        """Run once every prefill-attention shape a step can meet for contexts up to max_ctx, in the calling
        thread: where a kernel library builds and caches an execution plan per shape and thread (cuDNN's
        SDPA), the thread that will run the steps calls this before serving. Returns the shapes run (0:
        nothing to warm)."""
        ...
