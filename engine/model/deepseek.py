"""DeepSeek-V3 / Kimi-K2 decoder: embed -> [MLA + (dense MLP | MoE)] x L -> norm -> lm_head.

Call contract (shared with the runtime; see engine/README.md):
    hidden = model(input_ids [T], positions [T], meta, kv_caches)   # -> [T, hidden]
    logits = model.compute_logits(hidden[idx])                       # -> [n, vocab] float32
The embedding is replicated; lm_head is split over the vocabulary (when it divides by tp) and its
logits gathered, so every rank reads only its slice of the largest weight and still gets full-vocab logits.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from k2bench.engine.model.attention import MLAttention
from k2bench.engine.model.attn_meta import AttentionMetadata
from k2bench.engine.model.config import ModelConfig
from k2bench.engine.model.layers import RMSNorm
from k2bench.engine.model.moe import DenseMLP, MoE
from k2bench.engine.model.parallel import Linear, Parallel, TensorSpec, float_spec, replicated_param


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, par: Parallel, idx: int) -> None:
        super().__init__()
        prefix = f"{cfg.model_prefix}.layers.{idx}"
        self.prefix = prefix
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, par)
        self.self_attn = MLAttention(cfg, par, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, par)
        if cfg.is_moe_layer(idx):
            self.mlp: nn.Module = MoE(cfg, par, f"{prefix}.mlp")
        else:
            if cfg.intermediate_size % par.size:
                raise ValueError(f"intermediate_size {cfg.intermediate_size} is not divisible by tp={par.size}")
            self.mlp = DenseMLP(cfg, par, f"{prefix}.mlp", cfg.intermediate_size, reduce=True)

    def specs(self) -> Iterator[TensorSpec]:
        yield from self.input_layernorm.specs(f"{self.prefix}.input_layernorm")
        yield from self.self_attn.specs()
        yield from self.post_attention_layernorm.specs(f"{self.prefix}.post_attention_layernorm")
        yield from self.mlp.specs()

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, meta: AttentionMetadata,
        kv_cache: torch.Tensor, plan,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (this layer's MLP output, the residual stream before it); the caller's next norm adds the two.

        Keeping the sum pending lets each norm do the residual add in the same pass (same rounding as
        `x + f(norm(x))`); `residual` is None for the first layer, whose input is the embedding."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        attn = self.self_attn(h, positions, meta, kv_cache, plan)
        if self.mlp.takes_quantized:  # the MLP's A4W4 input quantised in the norm's pass
            h, residual, hq = self.post_attention_layernorm(attn, residual, quantize=True)
            return self.mlp(h, hq), residual
        h, residual = self.post_attention_layernorm(attn, residual)
        return self.mlp(h), residual


def warm_up_token_counts(max_tokens: int) -> list[int]:
    """Token counts a step can carry, dense enough that each size regime of the MLP kernels (tiles by pairs
    per expert, alignment chunks by pairs: thresholds at and between powers of two) holds at least one:
    1..16, then 16 per octave, and max_tokens."""
    counts = set(range(1, min(16, max_tokens) + 1))
    t = 16.0
    while t < max_tokens:
        counts.add(int(round(t)))
        t *= 2 ** (1 / 16)
    counts.add(max_tokens)
    return sorted(c for c in counts if 1 <= c <= max_tokens)


class DeepseekV3ForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, par: Parallel) -> None:
        super().__init__()
        self.cfg = cfg
        self.par = par
        self.embed_tokens = replicated_param((cfg.vocab_size, cfg.hidden_size), par.dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, par, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, par)
        q = cfg.quant
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Linear(
                cfg.hidden_size, cfg.vocab_size, par, tp_dim=0 if cfg.vocab_size % par.size == 0 else None,
                quantized=q is not None and q.is_quantized(cfg.lm_head_name), name="lm_head",
            )
        )

    def checkpoint_specs(self) -> Iterator[TensorSpec]:
        """Every tensor the checkpoint must provide, by its checkpoint name, with its full shape."""
        p = self.cfg.model_prefix
        yield float_spec(f"{p}.embed_tokens.weight", self.embed_tokens)
        for layer in self.layers:
            yield from layer.specs()
        yield from self.norm.specs(f"{p}.norm")
        if self.lm_head is not None:
            yield from self.lm_head.specs(self.cfg.lm_head_name)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[torch.Tensor],
        plan=None,
    ) -> torch.Tensor:
        """`plan`: a prebuilt attention plan (CUDA-graph decode); None builds it from `meta`."""
        x = F.embedding(input_ids, self.embed_tokens)
        if plan is None:
            plan = self.par.backend.plan_attention(meta, self.cfg.kv_cache_dim)
        residual = None
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, positions, meta, cache, plan)
        return self.norm(x) if residual is None else self.norm(x, residual)[0]

    @torch.inference_mode()
    def warm_up(self, max_ctx: int, max_tokens: int = 0, kv_cache: torch.Tensor | None = None) -> int:
        """Per-shape kernel plans of the prefill attention, built in the calling thread, and the decode
        attention's variants on `kv_cache` (a layer's paged cache, only read; `MLAttention.warm_up`), and on
        a GPU the MLP kernels' size variants (`warm_up_mlps`). Returns the calls run."""
        if not len(self.layers):
            return 0
        n = self.layers[0].self_attn.warm_up(max_ctx, kv_cache)
        if self.embed_tokens.device.type == "cuda":
            n += self.warm_up_mlps(max_tokens)
        return n

    @torch.inference_mode()
    def warm_up_mlps(self, max_tokens: int) -> int:
        """Run the MLP of the first layer of each kind (MoE: router, shared and routed experts; dense) as
        `DecoderLayer.forward` feeds it, at every count of `warm_up_token_counts(max_tokens)`. The MoE and
        dense-MLP kernels pick tiles, alignment chunks and K splits by size, each a variant Triton compiles
        when first met; one first met mid-serving stopped every stream for 0.2-1.1 s per kernel (an H200
        design card, 2026-12-03). Each rank on its own (`local`: no all-reduce); layers of a kind share
        their kernels. Returns the calls run."""
        firsts: dict[type, DecoderLayer] = {}
        for layer in self.layers:
            firsts.setdefault(type(layer.mlp), layer)
        if max_tokens < 1 or not firsts:
            return 0
        dev, dtype = self.embed_tokens.device, self.embed_tokens.dtype
        gen = torch.Generator(device=dev).manual_seed(0)
        counts = warm_up_token_counts(max_tokens)
        for layer in firsts.values():
            norm, mlp = layer.post_attention_layernorm, layer.mlp
            for t in counts:
                x = torch.randn(t, self.cfg.hidden_size, device=dev, dtype=dtype, generator=gen)
                if mlp.takes_quantized:  # the MLP's A4W4 input written by the norm, as in DecoderLayer.forward
                    h, _, hq = norm(x, torch.zeros_like(x), quantize=True)
                    mlp.local(h, hq)
                else:
                    mlp.local(norm(x, torch.zeros_like(x))[0])
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return len(firsts) * len(counts)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            return F.linear(hidden, self.embed_tokens).float()
        logits = self.lm_head(hidden).float()
        return self.par.all_gather_last(logits) if self.lm_head.tp_dim == 0 else logits
