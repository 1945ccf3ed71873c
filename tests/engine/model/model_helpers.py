"""Helpers for the engine-model tests: a minimal paged-cache driver and a tiny HF DeepSeek-V3 reference."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from k2bench.engine.model.attn_meta import AttentionMetadata


class PagedDriver:
    """Feeds a model through its real API with a block table built here (blocks handed out shuffled)."""

    def __init__(self, model, cfg, *, num_blocks: int = 96, block_size: int = 4, seed: int = 0,
                 cache_dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        self.model, self.cfg, self.bs, self.dev = model, cfg, block_size, device
        self.caches = [torch.zeros(num_blocks, block_size, cfg.kv_cache_dim, dtype=cache_dtype, device=device)
                       for _ in range(cfg.num_hidden_layers)]
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.blocks: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def step(self, work: list[tuple[int, list[int]]]) -> torch.Tensor:
        """work = [(seq_id, new_tokens)]; returns the logits of each sequence's last new token [B, vocab]."""
        ids, pos, slots, cu, ctx = [], [], [], [0], []
        for sid, toks in work:
            blocks = self.blocks.setdefault(sid, [])
            start = self.lens.get(sid, 0)
            for i, t in enumerate(toks):
                p = start + i
                if p // self.bs >= len(blocks):
                    blocks.append(self.free.pop())
                ids.append(t)
                pos.append(p)
                slots.append(blocks[p // self.bs] * self.bs + p % self.bs)
            self.lens[sid] = start + len(toks)
            cu.append(cu[-1] + len(toks))
            ctx.append(self.lens[sid])
        width = max(len(self.blocks[sid]) for sid, _ in work)
        table = torch.zeros(len(work), width, dtype=torch.long)
        for b, (sid, _) in enumerate(work):
            table[b, : len(self.blocks[sid])] = torch.tensor(self.blocks[sid])
        dev = self.dev
        meta = AttentionMetadata(
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
            context_lens=torch.tensor(ctx, dtype=torch.long, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            block_tables=table.to(dev),
            block_size=self.bs,
        )
        hidden = self.model(torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), meta, self.caches)
        last = torch.tensor(cu[1:], device=dev) - 1
        return self.model.compute_logits(hidden[last]).cpu()

    def prefill_all_logits(self, sid: int, toks: list[int]) -> torch.Tensor:
        """Logits of every position of a whole-prompt prefill [T, vocab]."""
        assert sid not in self.lens
        blocks = self.blocks.setdefault(sid, [])
        while len(blocks) * self.bs < len(toks):
            blocks.append(self.free.pop())
        slots = [blocks[p // self.bs] * self.bs + p % self.bs for p in range(len(toks))]
        self.lens[sid] = len(toks)
        dev = self.dev
        meta = AttentionMetadata(
            cu_seqlens_q=torch.tensor([0, len(toks)], dtype=torch.int32, device=dev),
            context_lens=torch.tensor([len(toks)], device=dev),
            slot_mapping=torch.tensor(slots, device=dev),
            block_tables=torch.tensor([blocks], device=dev),
            block_size=self.bs,
        )
        hidden = self.model(torch.tensor(toks, device=dev), torch.arange(len(toks), device=dev), meta, self.caches)
        return self.model.compute_logits(hidden).cpu()

    def greedy(self, prompts: list[list[int]], steps: int, chunk: int | None = None) -> list[list[int]]:
        """Batched greedy decoding: prefill all prompts in one step (or in chunks), then decode together."""
        out = [[] for _ in prompts]
        pending = {i: list(p) for i, p in enumerate(prompts)}
        last = None
        while pending:  # chunked prefill, all sequences share each step
            work = []
            for i, toks in list(pending.items()):
                n = len(toks) if chunk is None else chunk
                work.append((i, toks[:n]))
                pending[i] = toks[n:]
                if not pending[i]:
                    del pending[i]
            logits = self.step(work)
            last = {sid: logits[b] for b, (sid, _) in enumerate(work)}
            for sid in last:
                if sid not in pending:
                    out[sid].append(int(last[sid].argmax()))
        for _ in range(steps - 1):
            logits = self.step([(i, [out[i][-1]]) for i in range(len(prompts))])
            for i in range(len(prompts)):
                out[i].append(int(logits[i].argmax()))
        return out


def hf_tiny_config(**over):
    from transformers import DeepseekV3Config

    kw = dict(
        vocab_size=96, hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
        kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
                         "mscale": 1.0, "mscale_all_dim": 0.8},
        bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )
    kw.update(over)
    return DeepseekV3Config(**kw)


def hf_tiny_model(seed: int = 0, **over):
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    cfg = hf_tiny_config(**over)
    cfg._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():  # weights big enough that routing and attention matter
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
        for mod in model.modules():
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.copy_(0.3 * torch.randn(mod.e_score_correction_bias.shape, generator=g))
    return model


def hf_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens by recomputing the whole sequence each step (no HF cache involved)."""
    toks = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([toks])).logits[0, -1]
            toks.append(int(logits.argmax()))
    return toks[len(prompt):], logits


def hf_logits(model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].float()


def add_quark_config(model_dir: Path, dynamic_input: bool = True) -> dict:
    cfg = json.loads((model_dir / "config.json").read_text())
    fp4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1, "scale_format": "e8m0",
           "scale_calculation_mode": "even", "round_method": "half_even"}
    qc = {"quant_method": "quark",
          "global_quant_config": {"weight": dict(fp4, is_dynamic=False)},
          "exclude": ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"],
          "export": {"pack_method": "reorder", "weight_format": "real_quantized"}}
    if dynamic_input:
        qc["global_quant_config"]["input_tensors"] = dict(fp4, is_dynamic=True)
    cfg["quantization_config"] = qc
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    return cfg


def rewrite_checkpoint(src: Path, dst: Path, edit, config_edit=None, shards: int = 2) -> Path:
    """Copy a checkpoint with its tensors passed through `edit(dict) -> dict` (and config through config_edit)."""
    import shutil

    from safetensors.torch import load_file

    from k2bench.engine.model.tiny import save_sharded

    state = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(f)))
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    if config_edit is not None:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(config_edit(cfg), indent=2))
    save_sharded(edit(dict(state)), dst, shards)
    return dst


def tp_worker(rank: int, world: int, port: int, jobs: list, out_path: str) -> None:
    """One TP rank: load each (model_dir, dtype) job, run prefill logits and batched greedy decoding."""
    import torch.distributed as dist

    from k2bench.engine.model.loader import load_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = []
        for model_dir, prompts, steps in jobs:
            model, cfg = load_model(model_dir, dtype="float32", tp_rank=rank, tp_size=world)
            logits = PagedDriver(model, cfg).prefill_all_logits(0, prompts[0])
            tokens = PagedDriver(model, cfg, seed=7).greedy(prompts, steps, chunk=5)
            results.append({"logits": logits, "tokens": tokens, "quant_mode": model.quant_mode})
        if rank == 0:
            torch.save(results, out_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def bf16_activation_reference(device: str = "cpu"):
    """The torch backend with the triton backend's W4 numerics: activations rounded to bf16 before each
    MXFP4 matmul, and an expert's silu(gate) * up rounded to bf16 before its down projection.

    The triton W4 kernels feed bf16 activations (the tensor cores' input format), while the torch
    backend keeps float32 activations; on the random tiny model that difference alone moves logits
    by ~20%, so the triton W4 path is checked against this reference instead (plain PyTorch, a
    per-token loop over each token's experts)."""
    import torch.nn.functional as F

    from k2bench.engine.kernels.torch_backend import TorchBackend
    from k2bench.engine.model.mxfp4 import dequantize_mxfp4

    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.bfloat16).to(t.dtype)

    class Bf16ActivationReference(TorchBackend):
        name = "torch-bf16-activations"

        def linear(self, x, weight, weight_scale, *, a4w4=False, x_quantized=False):
            if weight_scale is None or a4w4:
                return super().linear(x, weight, weight_scale, a4w4=a4w4, x_quantized=x_quantized)
            return F.linear(bf16(x), dequantize_mxfp4(weight, weight_scale, x.dtype))

        def fused_moe(self, x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, *, a4w4=False, add=None,
                      x_quantized=False):
            if w13_scale is None or a4w4:
                return super().fused_moe(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, a4w4=a4w4, add=add,
                                         x_quantized=x_quantized)
            out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
            for t in range(x.shape[0]):
                for j in range(topk_ids.shape[1]):
                    e = int(topk_ids[t, j])
                    h = F.linear(bf16(x[t : t + 1]), dequantize_mxfp4(w13[e], w13_scale[e], x.dtype))
                    gate, up = h.chunk(2, dim=-1)
                    h = bf16(F.silu(gate) * up)
                    y = F.linear(h, dequantize_mxfp4(w2[e], w2_scale[e], x.dtype))
                    out[t] += float(topk_weights[t, j]) * y[0].float()
            return out.to(x.dtype) if add is None else out.to(x.dtype) + add

    return Bf16ActivationReference(device)
