"""The reference backend: plain PyTorch on any device. MXFP4 weights are dequantised and multiplied.

A4W4 mode fake-quantises each activation row per 32 along K (quantise then dequantise) before the
matmul, which is the numerics of gfx950's scaled-MFMA kernels; W4 mode keeps activations as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from k2bench.engine.kernels.backend import AttentionPlan
from k2bench.engine.model.attn_meta import AttentionMetadata
from k2bench.engine.model.layers import rms_norm_reference
from k2bench.engine.model.mxfp4 import dequantize_mxfp4, fake_quantize_mxfp4

if TYPE_CHECKING:
    from k2bench.engine.model.layers import Rotary

_FP8_MAX = {dt: torch.finfo(dt).max for dt in (torch.float8_e4m3fn, torch.float8_e5m2)}


@dataclass
class TorchPlan(AttentionPlan):
    """Where each sequence's context lives in the flat cache, for one step (the same for every layer)."""

    prefills: list[tuple[int, int, int, torch.Tensor]]  # (first token, end, context length, slots [ctx])
    decodes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]  # (token rows, slots, valid, width)


class ExpertStack(NamedTuple):
    """One MoE layer's experts in the checkpoint layout, as `fused_moe` receives them: the two MoE
    strategies below take them as one argument. A scale of None: float weights."""

    w13: torch.Tensor  # [E, 2I, H] (packed [E, 2I, H/2])
    w13_scale: torch.Tensor | None
    w2: torch.Tensor  # [E, H, I] (packed [E, H, I/2])
    w2_scale: torch.Tensor | None


# Upper bound on float32 attention scores held at once (elements); long prefills run in query slices.
SCORE_BUDGET = 1 << 22
# On CPU the batched MoE path (one copy of the expert weights per token-expert pair) only pays while
# the gathered packed bytes stay small: bench/engine_moe_bench.py has it 2x faster at the tiny
# model's 16 pairs x 16 KiB of packed w13 but 0.7-0.9x at 8-16 pairs x 256 KiB, where the per-expert loop's
# smaller, cache-resident pieces win. Other devices take it whenever pairs <= experts (sync-free;
# not yet measured on a GPU).
CPU_PAIR_BUDGET = 1 << 20  # pairs x elements of one expert's w13 (packed bytes for MXFP4)


class TorchBackend:
    name = "torch"
    graph_decode = False  # its plans are built on the host

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None, *, a4w4: bool = False,
        x_quantized: bool = False,
    ) -> torch.Tensor:
        if weight_scale is None:
            return F.linear(x, weight)
        w = dequantize_mxfp4(weight, weight_scale, x.dtype)
        if a4w4 and not x_quantized:
            x = fake_quantize_mxfp4(x)
        return F.linear(x, w)

    def dense_mlp(self, x, w13, w13_scale, w2, w2_scale, *, a4w4=False, x_quantized=False):
        gate_up = self.linear(x, w13, w13_scale, a4w4=a4w4, x_quantized=x_quantized)
        quant = a4w4 and w2_scale is not None  # SwiGLU, then the down GEMM's quantiser, in one op
        return self.linear(self.swiglu(gate_up, quant), w2, w2_scale, a4w4=a4w4, x_quantized=quant)

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
        quantize: bool = False,
    ):
        if residual is None:
            return rms_norm_reference(x, weight, eps)
        h = x + residual
        y = rms_norm_reference(h, weight, eps)
        return (y, h, fake_quantize_mxfp4(y)) if quantize else (y, h)

    def swiglu(self, x: torch.Tensor, quantize: bool = False) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        h = F.silu(gate) * up
        return fake_quantize_mxfp4(h) if quantize else h

    def mla_rope_cache(
        self, q_pe: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor, rotary: Rotary, norm_weight: torch.Tensor,
        eps: float, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        r = norm_weight.shape[0]
        latent = rms_norm_reference(kv[:, :r], norm_weight, eps)
        q_pe, k_pe = rotary(positions, q_pe, kv[:, r:])
        entry = torch.cat((latent, k_pe), dim=-1)
        if kv_cache.dtype in _FP8_MAX:  # fp8 casts overflow to NaN: saturate instead
            lim = _FP8_MAX[kv_cache.dtype]
            entry = entry.float().clamp(-lim, lim)
        kv_cache.view(-1, kv_cache.shape[-1])[slot_mapping] = entry.to(kv_cache.dtype)
        return q_pe

    def route_experts(
        self, scores: torch.Tensor, bias: torch.Tensor, *, top_k: int, n_group: int, topk_group: int,
        renormalize: bool, scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek-V3 selection: bias steers the choice only; groups ranked by their top-2 sum."""
        choice = scores + bias
        T, E = choice.shape
        if n_group > 1:
            grouped = choice.view(T, n_group, E // n_group)
            group_score = grouped.topk(min(2, E // n_group), dim=-1).values.sum(-1)
            keep = group_score.topk(topk_group, dim=-1).indices
            mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, True)
            choice = choice.masked_fill(~mask.repeat_interleave(E // n_group, dim=1), float("-inf"))
        ids = choice.topk(top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if renormalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * scale, ids

    def prepare_moe(self, w13, w13_scale, w2, w2_scale) -> bool:
        """The checkpoint layout is this backend's layout: it must stay."""
        return False

    def prepare_dense(self, w13, w13_scale, w2, w2_scale) -> bool:
        """Likewise for dense MLPs: the checkpoint layout is the only one this backend reads."""
        return False

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
        num_experts = w13.shape[0]
        xq = fake_quantize_mxfp4(x) if a4w4 and w13_scale is not None and not x_quantized else x  # per-row blocks: once for all experts
        pairs = topk_ids.numel()
        batched = pairs <= num_experts and (x.device.type != "cpu" or pairs * w13[0].numel() <= CPU_PAIR_BUDGET)
        strategy = self._moe_per_assignment if batched else self._moe_expert_loop
        out = strategy(xq, topk_ids, topk_weights, ExpertStack(w13, w13_scale, w2, w2_scale),
                       a4w4=a4w4 and w2_scale is not None)
        return out if add is None else out + add

    def _moe_expert_loop(
        self, xq: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w: ExpertStack, *, a4w4: bool
    ) -> torch.Tensor:
        """Many tokens: tokens sorted by expert, one dequantise + two matmuls per touched expert."""
        w13, w13_scale, w2, w2_scale = w
        num_experts = w13.shape[0]
        out = torch.zeros_like(xq)
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
            h = self.linear(xq[tok], w13[e], None if w13_scale is None else w13_scale[e], a4w4=False)
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
            h = self.linear(h, w2[e], None if w2_scale is None else w2_scale[e], a4w4=a4w4)
            out.index_add_(0, tok, (h * wts.unsqueeze(-1).to(h.dtype)).to(out.dtype))
        return out

    @staticmethod
    def _moe_per_assignment(
        xq: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w: ExpertStack, *, a4w4: bool
    ) -> torch.Tensor:
        """Few tokens (decode): every (token, expert) pair gets its own copy of the expert's weights.

        The chosen experts' packed weights are gathered and dequantised in one op per projection,
        and both projections run as one batched matmul over the T*k pairs, so there is no Python
        loop over experts and no host sync (the shapes depend only on T and k). Each pair sees the
        same dequantised weights and activations as in the per-expert loop; the k expert outputs
        of a token are summed in float32 (as HF's reference MoE does) and cast once.
        """
        w13, w13_scale, w2, w2_scale = w
        T, k = topk_ids.shape
        ids = topk_ids.reshape(-1)
        x = xq.repeat_interleave(k, dim=0).unsqueeze(1)  # [T*k, 1, H], pair t*k+j is token t
        w = w13[ids] if w13_scale is None else dequantize_mxfp4(w13[ids], w13_scale[ids], x.dtype)
        h = torch.bmm(x, w.transpose(1, 2))  # [T*k, 1, 2I]
        gate, up = h.chunk(2, dim=-1)
        h = F.silu(gate) * up
        if a4w4:
            h = fake_quantize_mxfp4(h)
        w = w2[ids] if w2_scale is None else dequantize_mxfp4(w2[ids], w2_scale[ids], h.dtype)
        y = torch.bmm(h, w.transpose(1, 2)).view(T, k, -1)  # [T, k, H]
        y = (y * topk_weights.view(T, k, 1).to(y.dtype)).float().sum(dim=1)
        return y.to(xq.dtype)

    def plan_attention(self, meta: AttentionMetadata, kv_dim: int) -> TorchPlan:
        """Per-step gather indices, shared by every layer: built once per forward, not once per layer."""
        cu = meta.cu_seqlens_q.tolist()
        ctx_lens = meta.context_lens.tolist()
        bs = meta.block_size
        dev = meta.block_tables.device
        tables = meta.block_tables.to(torch.long)
        offs = torch.arange(bs, device=dev)
        prefills = []
        decodes = [b for b in range(len(ctx_lens)) if cu[b + 1] - cu[b] == 1]
        for b in range(len(ctx_lens)):
            s, e, ctx = cu[b], cu[b + 1], ctx_lens[b]
            if e - s > 1:
                nblk = -(-ctx // bs)
                slots = (tables[b, :nblk].unsqueeze(1) * bs + offs).reshape(-1)[:ctx]
                prefills.append((s, e, ctx, slots))
        groups = []
        if decodes:
            width = max(ctx_lens[b] for b in decodes)
            nblk = -(-width // bs)
            size = max(1, (1 << 26) // max(1, width * kv_dim))  # bound the gathered keys per group
            for g0 in range(0, len(decodes), size):
                rows = torch.tensor(decodes[g0 : g0 + size], device=dev)
                # past a sequence's own blocks its table row is padding (block 0): gathered, then masked
                slots = (tables[rows, :nblk].unsqueeze(-1) * bs + offs).reshape(len(rows), -1)[:, :width]
                valid = torch.arange(width, device=dev).unsqueeze(0) < meta.context_lens[rows].unsqueeze(1)
                idx = meta.cu_seqlens_q[rows].to(torch.long)
                groups.append((idx, slots, valid, width))
        return TorchPlan(prefills, groups)

    def decode_plan(self, meta: AttentionMetadata, kv_dim: int) -> TorchPlan:
        """Decode steps need nothing special here: the general plan (it reads lengths on the host)."""
        return self.plan_attention(meta, kv_dim)

    def warm_up_mla(self, w_uk, w_uv, rope_dim, max_ctx, scale) -> int:
        """Nothing here builds per-shape plans."""
        return 0

    def warm_up_decode(self, w_uk, rope_dim, kv_cache, scale) -> int:
        """Nothing here compiles."""
        return 0

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
        """Per-head attention values [T, H, v] from q_nope [T, H, nope] and q_pe [T, H, rope].

        w_uk [H, nope, r] / w_uv [H, v, r] are the two halves of kv_b_proj. This backend runs
        everything in the absorbed form: q_nope is multiplied into the latent space, attention runs
        over the cached latents (`mla_attention`), and w_uv maps the latent output to the values.
        """
        if not isinstance(plan, TorchPlan):
            raise TypeError(f"the torch backend got a {type(plan).__name__}, not its own plan")
        q_lat = torch.einsum("thd,hdr->thr", q_nope, w_uk)
        o_lat = self.mla_attention(q_lat, q_pe, kv_cache, plan, scale, w_uk.shape[-1])
        return torch.einsum("thr,hvr->thv", o_lat.to(w_uv.dtype), w_uv)

    def mla_attention(
        self,
        q_lat: torch.Tensor,
        q_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        plan: TorchPlan,
        scale: float,
        kv_lora_rank: int,
    ) -> torch.Tensor:
        """Causal attention of each sequence's new tokens over its cached latents (absorbed MLA).

        q_lat [T, H, r] (the no-rope query multiplied into the latent space), q_pe [T, H, rope]; the
        cache holds [latent r | rope key] per token, shared by all heads, so it is both the key (all
        of it) and the value (the latent part). Single-token (decode) sequences are batched, padded to
        the longest context in groups; prefill chunks run one sequence at a time.
        """
        T, H, r = q_lat.shape
        q = torch.cat((q_lat, q_pe.to(q_lat.dtype)), dim=-1)  # [T, H, D]
        out = torch.empty(T, H, r, dtype=q_lat.dtype, device=q_lat.device)
        flat = kv_cache.view(-1, kv_cache.shape[-1])
        for s, e, ctx, slots in plan.prefills:
            kv = flat[slots].to(q.dtype)
            out[s:e] = self._attend(q[s:e].unsqueeze(0), kv.unsqueeze(0), None, ctx, scale, r)[0]
        for idx, slots, valid, width in plan.decodes:
            kv = flat[slots].to(q.dtype)  # [G, width, D]
            out[idx] = self._attend(q[idx].unsqueeze(1), kv, valid, width, scale, r)[:, 0]
        return out

    @staticmethod
    def _attend(
        q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor | None, ctx: int, scale: float, r: int
    ) -> torch.Tensor:
        """q [B, n, H, D], kv [B, ctx, D] -> [B, n, H, r]; queries are the last n positions (causal).

        All heads share the one latent key/value, so heads simply become extra query rows of a single
        matmul (no per-head copies of the cache). Queries are processed in slices so the score matrix
        stays bounded for long prefills; scores and softmax are float32.
        """
        B, n, H, D = q.shape
        out = torch.empty(B, n, H, r, dtype=q.dtype, device=q.device)
        step = n if n == 1 else max(16, SCORE_BUDGET // max(1, B * H * ctx))
        for a in range(0, n, step):
            z = min(n, a + step)
            kend = ctx - n + z  # query i sits at position ctx - n + i: later keys are never visible
            rows = q[:, a:z].reshape(B, (z - a) * H, D)
            scores = torch.bmm(rows, kv[:, :kend].transpose(1, 2)).float().view(B, z - a, H, kend) * scale
            if z - a > 1:
                qpos = torch.arange(ctx - n + a, kend, device=q.device)
                future = torch.arange(kend, device=q.device).view(1, kend) > qpos.view(-1, 1)
                scores.masked_fill_(future.view(1, z - a, 1, kend), float("-inf"))
            if valid is not None:
                scores.masked_fill_(~valid[:, :kend].view(B, 1, 1, kend), float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(kv.dtype).view(B, (z - a) * H, kend)
            out[:, a:z] = torch.bmm(probs, kv[:, :kend, :r]).view(B, z - a, H, r)
        return out
