"""Model configuration parsed from a Hugging Face config.json (DeepSeek-V3 / Kimi-K2 / Kimi-K2.5).

The K2.5 multimodal wrapper keeps the text model under `text_config` and its weights under
`language_model.model.*` (lm_head under `language_model.lm_head`); vision weights are skipped.
Values the engine does not implement (another scoring function, activation, ...) are rejected
with a message naming the key, never silently ignored.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k2bench.errors import UserError


class ConfigError(UserError):
    """config.json describes something this engine cannot run."""


@dataclass(frozen=True)
class QuantConfig:
    """Quark MXFP4 export: which modules are MXFP4 and whether activations are quantised too."""

    exclude: tuple[str, ...] = ()
    dynamic_input: bool = False  # input_tensors declared fp4 per_group is_dynamic: A4W4
    group_size: int = 32

    def is_quantized(self, module_name: str) -> bool:
        """module_name is the checkpoint name without `.weight` (e.g. `model.layers.3.mlp.experts.0.up_proj`).

        An exclude entry is a `re:` regex (matched from the start, as compressed-tensors/vLLM do),
        an fnmatch pattern, or a module name that matches itself, its children, and any module it
        ends (so a bare `lm_head` also covers the wrapped `language_model.lm_head`).
        """
        for pat in self.exclude:
            if pat.startswith("re:"):
                if re.match(pat[3:], module_name):
                    return False
            elif any(ch in pat for ch in "*?["):
                if fnmatch.fnmatchcase(module_name, pat):
                    return False
            elif (
                module_name == pat
                or module_name.startswith(pat + ".")
                or module_name.endswith("." + pat)  # "lm_head" also names K2.5's "language_model.lm_head"
            ):
                return False
        return True


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # "default" or "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    first_k_dense_replace: int
    moe_layer_freq: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    rms_norm_eps: float
    rope: RopeConfig
    rope_interleave: bool
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    tie_word_embeddings: bool
    torch_dtype: str  # "bfloat16", "float32", "float16"
    quant: QuantConfig | None = None
    model_prefix: str = "model"  # checkpoint prefix of the decoder ("language_model.model" for K2.5)
    lm_head_name: str = "lm_head"
    skip_prefixes: tuple[str, ...] = ()  # checkpoint prefixes that are ignored on purpose (vision tower)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        """Values per token per layer in the latent cache: compressed kv then the rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """1/sqrt(qk_head_dim), times mscale^2 under YaRN with mscale_all_dim (DeepSeek-V3's correction)."""
        scale = self.qk_head_dim**-0.5
        r = self.rope
        if r.kind == "yarn" and r.mscale_all_dim:
            m = yarn_get_mscale(r.factor, r.mscale_all_dim)
            scale = scale * m * m
        return scale

    def is_moe_layer(self, layer: int) -> bool:
        return (
            self.n_routed_experts > 0
            and layer >= self.first_k_dense_replace
            and layer % self.moe_layer_freq == 0
        )


def _get(d: dict[str, Any], key: str, default: Any = ..., *, where: str) -> Any:
    if key in d and d[key] is not None:
        return d[key]
    if default is ...:
        raise ConfigError(f"{where}: missing required key {key!r}")
    return default


def _parse_rope(text: dict[str, Any], where: str) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters` (with rope_theta inside); older files `rope_scaling`.
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", text.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind != "yarn":
        raise ConfigError(f"{where}: rope type {kind!r} is not supported (default or yarn)")
    return RopeConfig(
        theta=theta,
        kind="yarn",
        factor=float(params["factor"]),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 4096)),
        beta_fast=float(params.get("beta_fast", 32)),
        beta_slow=float(params.get("beta_slow", 1)),
        mscale=float(params.get("mscale", 1.0)),
        mscale_all_dim=float(params.get("mscale_all_dim", 0.0)),
    )


def _parse_quant(qc: dict[str, Any] | None, where: str) -> QuantConfig | None:
    if not qc:
        return None
    method = qc.get("quant_method")
    if method != "quark":
        raise ConfigError(f"{where}: quantization_config.quant_method {method!r} not supported (only 'quark' MXFP4)")
    glob = qc.get("global_quant_config") or {}
    w = glob.get("weight") or {}
    if isinstance(w, list):
        w = w[0] if w else {}
    if w.get("dtype") != "fp4" or int(w.get("group_size", 32)) != 32:
        raise ConfigError(f"{where}: only Quark fp4 weights with group_size 32 (MXFP4) are supported, got {w}")
    if w.get("scale_format", "e8m0") != "e8m0":
        raise ConfigError(f"{where}: MXFP4 weight scale_format must be e8m0, got {w.get('scale_format')!r}")
    inp = glob.get("input_tensors") or {}
    if isinstance(inp, list):
        inp = inp[0] if inp else {}
    dynamic = bool(inp) and inp.get("dtype") == "fp4" and bool(inp.get("is_dynamic", False))
    exclude = tuple(str(x) for x in (qc.get("exclude") or []))
    return QuantConfig(exclude=exclude, dynamic_input=dynamic)


def parse_config(raw: dict[str, Any], where: str = "config.json") -> ModelConfig:
    top = raw
    model_prefix, lm_head_name, skip = "model", "lm_head", ()
    if "text_config" in raw:  # Kimi-K2.5 multimodal wrapper
        text = dict(raw["text_config"])
        model_prefix, lm_head_name = "language_model.model", "language_model.lm_head"
        skip = ("vision_tower.", "mm_projector.", "multi_modal_projector.", "vision_model.")
    else:
        text = raw
    scoring = text.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        raise ConfigError(f"{where}: scoring_func {scoring!r} not supported (sigmoid)")
    topk_method = text.get("topk_method", "noaux_tc")
    if topk_method not in ("noaux_tc",):
        raise ConfigError(f"{where}: topk_method {topk_method!r} not supported (noaux_tc)")
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{where}: hidden_act {act!r} not supported (silu)")
    if text.get("attention_bias"):
        raise ConfigError(f"{where}: attention_bias=true is not supported")
    heads = int(_get(text, "num_attention_heads", where=where))
    kv_heads = int(text.get("num_key_value_heads") or heads)
    if kv_heads != heads:
        raise ConfigError(f"{where}: MLA needs num_key_value_heads == num_attention_heads ({kv_heads} != {heads})")
    eos = text.get("eos_token_id", top.get("eos_token_id"))
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    dtype = str(text.get("dtype") or text.get("torch_dtype") or top.get("dtype") or top.get("torch_dtype") or "bfloat16")
    qc = top.get("quantization_config") or text.get("quantization_config")
    n_routed = int(text.get("n_routed_experts") or 0)
    q_lora = text.get("q_lora_rank")
    cfg = ModelConfig(
        vocab_size=int(_get(text, "vocab_size", where=where)),
        hidden_size=int(_get(text, "hidden_size", where=where)),
        intermediate_size=int(_get(text, "intermediate_size", where=where)),
        moe_intermediate_size=int(_get(text, "moe_intermediate_size", 0, where=where)),
        num_hidden_layers=int(_get(text, "num_hidden_layers", where=where)),
        num_attention_heads=heads,
        q_lora_rank=int(q_lora) if q_lora else None,
        kv_lora_rank=int(_get(text, "kv_lora_rank", where=where)),
        qk_nope_head_dim=int(_get(text, "qk_nope_head_dim", where=where)),
        qk_rope_head_dim=int(_get(text, "qk_rope_head_dim", where=where)),
        v_head_dim=int(_get(text, "v_head_dim", where=where)),
        n_routed_experts=n_routed,
        n_shared_experts=int(text.get("n_shared_experts") or 0),
        num_experts_per_tok=int(text.get("num_experts_per_tok") or 0),
        n_group=int(text.get("n_group") or 1),
        topk_group=int(text.get("topk_group") or 1),
        first_k_dense_replace=int(text.get("first_k_dense_replace") or 0),
        moe_layer_freq=int(text.get("moe_layer_freq") or 1),
        norm_topk_prob=bool(text.get("norm_topk_prob", True)),
        routed_scaling_factor=float(text.get("routed_scaling_factor") or 1.0),
        rms_norm_eps=float(text.get("rms_norm_eps") or 1e-6),
        rope=_parse_rope(text, where),
        rope_interleave=bool(text.get("rope_interleave", True)),
        max_position_embeddings=int(_get(text, "max_position_embeddings", where=where)),
        bos_token_id=text.get("bos_token_id", top.get("bos_token_id")),
        eos_token_id=eos_ids[0] if eos_ids else None,
        eos_token_ids=eos_ids,
        pad_token_id=text.get("pad_token_id", top.get("pad_token_id")),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        torch_dtype=dtype,
        quant=_parse_quant(qc, where),
        model_prefix=model_prefix,
        lm_head_name=lm_head_name,
        skip_prefixes=skip,
        raw=raw,
    )
    if n_routed:
        if n_routed % cfg.n_group or cfg.topk_group > cfg.n_group:
            raise ConfigError(f"{where}: n_routed_experts {n_routed} / n_group {cfg.n_group} / topk_group {cfg.topk_group} inconsistent")
        if cfg.num_experts_per_tok > n_routed:
            raise ConfigError(f"{where}: num_experts_per_tok > n_routed_experts")
    return cfg


def load_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"no config.json in {model_dir}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
    return parse_config(raw, str(path))
