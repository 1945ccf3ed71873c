"""Write a tiny Kimi-K2-shaped checkpoint (bf16 or Quark MXFP4) plus a real tokenizer, for CPU runs.

Same structure and file format as the real model, scaled down: a dense first layer, MoE layers
with sigmoid routing + correction bias and group-limited top-k, q_lora / kv_lora, YaRN rope;
safetensors sharded with an index; for `--quant mxfp4` a Quark-style quantization_config with its
exclude list, experts / shared experts / dense MLP as packed E2M1 + E8M0 scales. The dimensions
let TP 1, 2 and 4 split everything (MXFP4 row-parallel shards stay multiples of 32).
The tokenizer is a byte-level BPE trained on a built-in text, with bos/eos/pad specials and a
chat template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from k2bench.engine.model.mxfp4 import DEFAULT_SCALE_RULE, quantize_mxfp4


@dataclass(frozen=True)
class TinySpec:
    """One place for the tiny model's defaults (the CLI reads these)."""

    layers: int = 4  # layer 0 dense, the rest MoE
    hidden: int = 128
    heads: int = 4
    intermediate: int = 256
    moe_intermediate: int = 128
    experts: int = 16
    experts_per_tok: int = 4
    n_group: int = 4
    topk_group: int = 2
    q_lora: int = 96
    kv_lora: int = 32
    nope: int = 32
    rope: int = 16
    v: int = 32
    vocab: int = 512  # the tokenizer's target size; the model's vocab_size too unless model_vocab is set
    max_positions: int = 16384
    shards: int = 2
    rope_factor: float = 4.0  # YaRN factor (original_max_position_embeddings 4096)
    model_vocab: int | None = None  # embedding rows when larger than the trained tokenizer (full-width runs)


# Kimi-K2.5's text model at full layer width (reference/KIMI_K2.md) with only a few layers: real
# per-layer shapes and bytes for GPU runs, without the 1T parameters. Ids past the tiny tokenizer are
# valid model ids (prompts are token ids) and decode to nothing.
KIMI_K2_WIDTH = TinySpec(
    layers=4, hidden=7168, heads=64, intermediate=18432, moe_intermediate=2048, experts=384,
    experts_per_tok=8, n_group=1, topk_group=1, q_lora=1536, kv_lora=512, nope=128, rope=64, v=128,
    vocab=512, model_vocab=163840, max_positions=262144, shards=4, rope_factor=64.0,
)
PRESETS = {"tiny": TinySpec(), "kimi-k2-width": KIMI_K2_WIDTH}


SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|im_system|>{% elif m['role'] == 'user' %}<|im_user|>{% else %}<|im_assistant|>{% endif %}"
    "{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"
)

_CORPUS = """
The quick brown fox jumps over the lazy dog. A benchmark measures how fast a server answers
requests, how many tokens per second it produces for each user, and how many it produces per GPU.
Mixture of experts models route every token to a few experts; the router scores each expert with a
sigmoid, adds a correction bias for the choice, and keeps the top experts of the best groups.
Multi-head latent attention caches a compressed latent vector and a small rotary key per token.
Microscaling formats share one power-of-two scale between thirty-two four-bit values.
Hello, how are you today? I am fine, thank you. What is the weather like? It is sunny and warm.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Punctuation: , . ; : ! ? ( ) [ ] { } " ' - + * / = < >
"""


def build_tokenizer(vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return tok


def _config(spec: TinySpec, vocab: int, ids: dict[str, int], quant: str) -> dict:
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "moe_intermediate_size": spec.moe_intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.heads,
        "n_routed_experts": spec.experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": spec.experts_per_tok,
        "n_group": spec.n_group,
        "topk_group": spec.topk_group,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.827,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "q_lora_rank": spec.q_lora,
        "kv_lora_rank": spec.kv_lora,
        "qk_nope_head_dim": spec.nope,
        "qk_rope_head_dim": spec.rope,
        "v_head_dim": spec.v,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": spec.rope_factor,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "max_position_embeddings": spec.max_positions,
        "bos_token_id": ids["<|bos|>"],
        "eos_token_id": ids["<|eos|>"],
        "pad_token_id": ids["<|pad|>"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "num_nextn_predict_layers": 0,
    }
    if quant == "mxfp4":
        fp4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1,
               "scale_format": "e8m0", "scale_calculation_mode": "even", "round_method": "half_even"}
        cfg["quantization_config"] = {
            "quant_method": "quark",
            "global_quant_config": {"weight": dict(fp4, is_dynamic=False), "input_tensors": dict(fp4, is_dynamic=True)},
            "exclude": ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"],
            "export": {"pack_method": "reorder", "weight_format": "real_quantized"},
        }
    return cfg


def weight_plan(spec: TinySpec, vocab: int) -> list[tuple[str, tuple[int, ...], str, float]]:
    """Every tensor of the checkpoint with HF names: (name, shape, kind, std), kind in w/norm/bias.

    Scales keep activations O(1) through the layers. Grouped by layer in file order.
    """
    s = spec
    plan: list[tuple[str, tuple[int, ...], str, float]] = []

    def w(name: str, *shape: int, std: float | None = None) -> None:
        plan.append((name, shape, "w", std if std is not None else shape[-1] ** -0.5))

    def norm(name: str, n: int) -> None:
        plan.append((name, (n,), "norm", 0.1))

    w("model.embed_tokens.weight", vocab, s.hidden, std=1.0)
    for i in range(s.layers):
        p = f"model.layers.{i}"
        norm(f"{p}.input_layernorm.weight", s.hidden)
        norm(f"{p}.post_attention_layernorm.weight", s.hidden)
        a = f"{p}.self_attn"
        w(f"{a}.q_a_proj.weight", s.q_lora, s.hidden)
        norm(f"{a}.q_a_layernorm.weight", s.q_lora)
        w(f"{a}.q_b_proj.weight", s.heads * (s.nope + s.rope), s.q_lora)
        w(f"{a}.kv_a_proj_with_mqa.weight", s.kv_lora + s.rope, s.hidden)
        norm(f"{a}.kv_a_layernorm.weight", s.kv_lora)
        w(f"{a}.kv_b_proj.weight", s.heads * (s.nope + s.v), s.kv_lora)
        w(f"{a}.o_proj.weight", s.hidden, s.heads * s.v)
        m = f"{p}.mlp"
        if i == 0:
            w(f"{m}.gate_proj.weight", s.intermediate, s.hidden)
            w(f"{m}.up_proj.weight", s.intermediate, s.hidden)
            w(f"{m}.down_proj.weight", s.hidden, s.intermediate)
            continue
        w(f"{m}.gate.weight", s.experts, s.hidden)
        plan.append((f"{m}.gate.e_score_correction_bias", (s.experts,), "bias", 0.05))
        for e in range(s.experts):
            w(f"{m}.experts.{e}.gate_proj.weight", s.moe_intermediate, s.hidden)
            w(f"{m}.experts.{e}.up_proj.weight", s.moe_intermediate, s.hidden)
            w(f"{m}.experts.{e}.down_proj.weight", s.hidden, s.moe_intermediate, std=0.5 * s.moe_intermediate**-0.5)
        w(f"{m}.shared_experts.gate_proj.weight", s.moe_intermediate, s.hidden)
        w(f"{m}.shared_experts.up_proj.weight", s.moe_intermediate, s.hidden)
        w(f"{m}.shared_experts.down_proj.weight", s.hidden, s.moe_intermediate)
    norm("model.norm.weight", s.hidden)
    w("lm_head.weight", vocab, s.hidden)
    return plan


def _draw(shape: tuple[int, ...], kind: str, std: float, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(*shape, generator=g, device=g.device)
    return 1.0 + std * x if kind == "norm" else std * x


def random_state(spec: TinySpec, vocab: int, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Float32 weights with the HF names (whole model in memory: for small specs and tests)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return {name: _draw(shape, kind, std, g) for name, shape, kind, std in weight_plan(spec, vocab)}


def quantize_state(
    state: dict[str, torch.Tensor], exclude_check, scale_rule: str = DEFAULT_SCALE_RULE
) -> dict[str, torch.Tensor]:
    """Replace each linear `<module>.weight` that `exclude_check(module)` says is quantised by FP4 + E8M0.

    Quark quantises linear layers only: embeddings and norms never are, whatever the exclude list says.
    """
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module is not None and t.dim() == 2 and not module.endswith("embed_tokens") and exclude_check(module):
            packed, scale = quantize_mxfp4(t, scale_rule)
            out[name] = packed
            out[f"{module}.weight_scale"] = scale
        else:
            out[name] = t
    return out


def save_sharded(state: dict[str, torch.Tensor], out: Path, shards: int) -> None:
    """Write an in-memory state as `model-0000i-of-0000n.safetensors` files plus the index (tests use this)."""
    from safetensors.torch import save_file

    names = list(state)
    per = -(-len(names) // shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        if not part:
            continue
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n].contiguous() for n in part}, str(out / fname), metadata={"format": "pt"})
        for n in part:
            weight_map[n] = fname
            total += state[n].numel() * state[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _shard_groups(plan: list, shards: int) -> list[list]:
    """Split the plan into `shards` contiguous groups of whole layers (embeddings go first, head last)."""
    layer_of = [int(n.split(".")[2]) if n.startswith("model.layers.") else None for n, *_ in plan]
    last = max((x for x in layer_of if x is not None), default=0)
    layer_of = [(0 if n.startswith("model.embed") else last) if x is None else x for x, (n, *_) in zip(layer_of, plan, strict=True)]
    per = -(-(last + 1) // max(1, shards))
    groups: list[list] = [[] for _ in range(-(-(last + 1) // per))]
    for item, layer in zip(plan, layer_of, strict=True):
        groups[layer // per].append(item)
    return groups


def save_streaming(plan: list, out: Path, shards: int, *, seed: int, device: str, quantized, log=None) -> None:
    """Draw, quantise (where `quantized(module)`) and write one shard at a time, plus the index.

    Each shard has its own generator (seeded from `seed` and the shard number), so a shard's values
    do not depend on the device memory or the order other shards were written in.
    """
    from safetensors.torch import save_file

    groups = _shard_groups(plan, shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i, group in enumerate(groups):
        g = torch.Generator(device=device).manual_seed(seed * 1000 + i)
        state: dict[str, torch.Tensor] = {}
        for name, shape, kind, std in group:
            t = _draw(shape, kind, std, g)
            state.update({k: v.cpu() for k, v in quantize_state({name: t}, quantized).items()})
        state = {k: (v.to(torch.bfloat16) if v.is_floating_point() and "e_score_correction_bias" not in k else v)
                 for k, v in state.items()}
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(state, str(out / fname), metadata={"format": "pt"})
        for n, v in state.items():
            weight_map[n] = fname
            total += v.numel() * v.element_size()
        if log:
            log(f"wrote {fname}: {len(state)} tensors, {sum(v.numel() * v.element_size() for v in state.values()) / 1e9:.2f} GB")
        del state
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_tiny_checkpoint(
    out_dir: str | Path, *, quant: str = "mxfp4", seed: int = 0, spec: TinySpec | None = None,
    device: str = "cpu", log=None,
) -> Path:
    from k2bench.engine.model.config import parse_config

    if quant not in ("mxfp4", "bf16"):
        raise ValueError(f"quant must be mxfp4 or bf16, got {quant!r}")
    spec = spec or TinySpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(spec.vocab)
    vocab = max(tok.get_vocab_size(), spec.model_vocab or 0)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    cfg = _config(spec, vocab, ids, quant)
    quantized = parse_config(cfg).quant.is_quantized if quant == "mxfp4" else (lambda module: False)
    save_streaming(weight_plan(spec, vocab), out, spec.shards, seed=seed, device=device, quantized=quantized, log=log)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": ids["<|bos|>"], "eos_token_id": ids["<|eos|>"], "pad_token_id": ids["<|pad|>"]}, indent=2)
    )
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|bos|>",
                "eos_token": "<|eos|>",
                "pad_token": "<|pad|>",
                "add_bos_token": False,
                "add_eos_token": False,
                "model_max_length": spec.max_positions,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    return out
