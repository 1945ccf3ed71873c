"""Multi-head latent attention (MLA) over the paged latent KV cache.

The cache stores, per token, the normalised compressed kv (kv_lora_rank values) followed by the
rotated rope key (qk_rope_head_dim values), shared by all heads. Attention runs in the absorbed
form for prefill and decode alike: the no-rope query is multiplied into the latent space with the
key half of kv_b_proj, scores are taken against the latents directly, and the value half of
kv_b_proj maps the latent output back to per-head values. This is algebraically the expanded form
(k_nope = W_uk c, v = W_uv c) without materialising per-head keys and values.

Heads are split over TP ranks (q_b_proj / kv_b_proj column parallel, o_proj row parallel plus an
all-reduce); the latent projections are replicated.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from k2bench.engine.model.attn_meta import AttentionMetadata
from k2bench.engine.model.config import ModelConfig
from k2bench.engine.model.layers import RMSNorm, Rotary
from k2bench.engine.model.parallel import Linear, Parallel, TensorSpec


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, par: Parallel, prefix: str) -> None:
        super().__init__()
        self.cfg = cfg
        self.par = par
        self.prefix = prefix
        if cfg.num_attention_heads % par.size:
            raise ValueError(f"num_attention_heads {cfg.num_attention_heads} is not divisible by tp={par.size}")
        self.heads = cfg.num_attention_heads // par.size
        q = cfg.quant

        def quantized(name: str) -> bool:
            return q is not None and q.is_quantized(f"{prefix}.{name}")

        H, qk = cfg.num_attention_heads, cfg.qk_head_dim
        if cfg.q_lora_rank:
            self.q_a_proj = Linear(cfg.hidden_size, cfg.q_lora_rank, par, quantized=quantized("q_a_proj"), name="q_a_proj")
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps, par)
            self.q_b_proj = Linear(cfg.q_lora_rank, H * qk, par, tp_dim=0, quantized=quantized("q_b_proj"), name="q_b_proj")
        else:
            self.q_proj = Linear(cfg.hidden_size, H * qk, par, tp_dim=0, quantized=quantized("q_proj"), name="q_proj")
        self.kv_a_proj_with_mqa = Linear(
            cfg.hidden_size, cfg.kv_cache_dim, par, quantized=quantized("kv_a_proj_with_mqa"), name="kv_a_proj_with_mqa"
        )
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps, par)
        self.kv_b_proj = Linear(
            cfg.kv_lora_rank, H * (cfg.qk_nope_head_dim + cfg.v_head_dim), par, tp_dim=0,
            quantized=quantized("kv_b_proj"), name="kv_b_proj",
        )
        self.o_proj = Linear(H * cfg.v_head_dim, cfg.hidden_size, par, tp_dim=1, quantized=quantized("o_proj"), name="o_proj")
        self.rotary = Rotary(cfg.qk_rope_head_dim, cfg.rope, cfg.rope_interleave)
        self.scale = cfg.softmax_scale

    def specs(self) -> Iterator[TensorSpec]:
        p = self.prefix
        if self.cfg.q_lora_rank:
            yield from self.q_a_proj.specs(f"{p}.q_a_proj")
            yield from self.q_a_layernorm.specs(f"{p}.q_a_layernorm")
            yield from self.q_b_proj.specs(f"{p}.q_b_proj")
        else:
            yield from self.q_proj.specs(f"{p}.q_proj")
        yield from self.kv_a_proj_with_mqa.specs(f"{p}.kv_a_proj_with_mqa")
        yield from self.kv_a_layernorm.specs(f"{p}.kv_a_layernorm")
        yield from self.kv_b_proj.specs(f"{p}.kv_b_proj")
        yield from self.o_proj.specs(f"{p}.o_proj")

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_cache: torch.Tensor, plan
    ) -> torch.Tensor:
        """`plan` is the backend's per-step attention plan (`backend.plan_attention(meta, kv_cache_dim)`)."""
        cfg = self.cfg
        T = x.shape[0]
        nope, rope_d, r, v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
        if cfg.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.view(T, self.heads, nope + rope_d)
        kv = self.kv_a_proj_with_mqa(x)
        # rope on q_pe and k_pe, the latent's norm and the cache write: one backend op (one kernel in triton)
        q_pe = self.par.backend.mla_rope_cache(q[..., nope:], kv, positions, self.rotary, self.kv_a_layernorm.weight,
                                               self.kv_a_layernorm.eps, kv_cache, meta.slot_mapping)
        q_nope = q[..., :nope]

        w = self._kv_b_dense().view(self.heads, nope + v, r)
        w_uk, w_uv = w[:, :nope, :], w[:, nope:, :]
        o = self.par.backend.mla(q_nope, q_pe, kv_cache, plan, self.scale, w_uk, w_uv)
        return self.par.all_reduce(self.o_proj(o.reshape(T, self.heads * v)))

    def warm_up(self, max_ctx: int, kv_cache: torch.Tensor | None = None) -> int:
        """The backend's per-shape plans of this layer's prefill attention (`warm_up_mla`) and, given a
        layer's paged cache, its decode attention's variants (`warm_up_decode`); every layer has the same
        shapes, so one layer's call serves all."""
        cfg = self.cfg
        w = self._kv_b_dense().view(self.heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
        nope = cfg.qk_nope_head_dim
        n = self.par.backend.warm_up_mla(w[:, :nope, :], w[:, nope:, :], cfg.qk_rope_head_dim, max_ctx, self.scale)
        if kv_cache is not None:
            n += self.par.backend.warm_up_decode(w[:, :nope, :], cfg.qk_rope_head_dim, kv_cache, self.scale)
        return n

    def _kv_b_dense(self) -> torch.Tensor:
        """kv_b_proj in the compute dtype, dequantised once (weights never change after loading)."""
        w = getattr(self, "_kv_b_cache", None)
        if w is None or w.device != self.kv_b_proj.weight.device:
            w = self.kv_b_proj.dense_weight()
            self._kv_b_cache = w
        return w
