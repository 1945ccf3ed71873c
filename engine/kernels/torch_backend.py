"""The reference backend: plain PyTorch on any device. MXFP4 weights are dequantised and multiplied.

A4W4 mode fake-quantises each activation row per 32 along K (quantise then dequantise) before the
matmul, which is the numerics of gfx950's scaled-MFMA kernels; W4 mode keeps activations as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from k2bench.engine.attn_meta import AttentionMetadata
from k2bench.engine.mxfp4 import dequantize_mxfp4, fake_quantize_mxfp4


class TorchBackend:
    name = "torch"

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None, *, a4w4: bool = False
    ) -> torch.Tensor:
        if weight_scale is None:
            return F.linear(x, weight)
        w = dequantize_mxfp4(weight, weight_scale, x.dtype)
        if a4w4:
            x = fake_quantize_mxfp4(x)
        return F.linear(x, w)

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
    ) -> torch.Tensor:
        out = torch.zeros_like(x)
        num_experts = w13.shape[0]
        flat_ids = topk_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
        token_of = order // topk_ids.shape[1]
        weight_of = topk_weights.reshape(-1)[order]
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            tok = token_of[start : start + n]
            wts = weight_of[start : start + n]
            start += n
            h = self.linear(x[tok], w13[e], None if w13_scale is None else w13_scale[e], a4w4=a4w4)
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
            h = self.linear(h, w2[e], None if w2_scale is None else w2_scale[e], a4w4=a4w4)
            out.index_add_(0, tok, (h * wts.unsqueeze(-1).to(h.dtype)).to(out.dtype))
        return out

    def mla_attention(
        self,
        q_lat: torch.Tensor,
        q_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        kv_lora_rank: int,
    ) -> torch.Tensor:
        """Causal attention of each sequence's new tokens over its cached latents (absorbed MLA).

        q_lat [T, H, r] (query already multiplied into the latent space), q_pe [T, H, rope];
        the cache holds [latent r | rope key] per token. Scores and softmax run in float32.
        """
        T, H, r = q_lat.shape
        out = torch.empty(T, H, r, dtype=q_lat.dtype, device=q_lat.device)
        bs = meta.block_size
        flat = kv_cache.view(-1, kv_cache.shape[-1])
        cu = meta.cu_seqlens_q.tolist()
        ctx_lens = meta.context_lens.tolist()
        for b in range(len(ctx_lens)):
            s, e, ctx = cu[b], cu[b + 1], ctx_lens[b]
            n = e - s
            if n == 0:
                continue
            nblk = (ctx + bs - 1) // bs
            blocks = meta.block_tables[b, :nblk].to(torch.long)
            slots = (blocks.unsqueeze(1) * bs + torch.arange(bs, device=blocks.device)).reshape(-1)[:ctx]
            kv = flat[slots].float()  # [ctx, r + rope]
            lat, kpe = kv[:, :kv_lora_rank], kv[:, kv_lora_rank:]
            scores = torch.einsum("thr,cr->htc", q_lat[s:e].float(), lat)
            scores = scores + torch.einsum("thd,cd->htc", q_pe[s:e].float(), kpe)
            scores = scores * scale
            if n > 1:
                qpos = torch.arange(ctx - n, ctx, device=scores.device).unsqueeze(1)
                kpos = torch.arange(ctx, device=scores.device).unsqueeze(0)
                scores = scores.masked_fill((kpos > qpos).unsqueeze(0), float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[s:e] = torch.einsum("htc,cr->thr", probs, lat).to(out.dtype)
        return out
