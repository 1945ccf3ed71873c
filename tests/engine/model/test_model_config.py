"""config.json parsing for the real Kimi-K2.5 layout (text_config wrapper, Quark exclude list), and cache dtypes."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.engine

K25_TEXT = {
    "model_type": "kimi_k2", "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
    "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.827,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "max_position_embeddings": 262144,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
    "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "num_nextn_predict_layers": 0,
}
FP4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1, "scale_format": "e8m0",
       "scale_calculation_mode": "even", "round_method": "half_even"}


def k25_config(exclude):
    return {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": dict(K25_TEXT), "vision_config": {"hidden_size": 1152},
        "quantization_config": {
            "quant_method": "quark",
            "global_quant_config": {"weight": dict(FP4, is_dynamic=False), "input_tensors": dict(FP4, is_dynamic=True)},
            "exclude": exclude,
            "export": {"pack_method": "reorder", "weight_format": "real_quantized"},
        },
    }


@pytest.mark.parametrize("exclude", [
    ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"],
    ["language_model.lm_head", "*self_attn*", "*.mlp.gate"],
])
def test_k25_config_and_exclude_list(exclude):
    from k2bench.engine.model.config import parse_config, yarn_get_mscale

    cfg = parse_config(k25_config(exclude))
    assert cfg.kv_cache_dim == 576 and cfg.num_hidden_layers == 61
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (163584, 163585, 163839)
    assert cfg.model_prefix == "language_model.model" and cfg.lm_head_name == "language_model.lm_head"
    assert cfg.quant.dynamic_input
    m = yarn_get_mscale(64.0, 1.0)
    assert math.isclose(cfg.softmax_scale, 192**-0.5 * m * m)
    assert not cfg.is_moe_layer(0) and cfg.is_moe_layer(1) and cfg.is_moe_layer(60)
    q = cfg.quant.is_quantized
    p = "language_model.model.layers"
    assert q(f"{p}.3.mlp.experts.17.down_proj") and q(f"{p}.3.mlp.shared_experts.up_proj") and q(f"{p}.0.mlp.gate_proj")
    assert not q(f"{p}.3.self_attn.kv_b_proj") and not q(f"{p}.3.mlp.gate") and not q("language_model.lm_head")


def test_config_rejects_what_it_cannot_run():
    from k2bench.engine.model.config import ConfigError, parse_config

    for key, val, msg in [("hidden_act", "gelu", "hidden_act"), ("topk_method", "greedy", "topk_method"),
                          ("num_key_value_heads", 8, "num_key_value_heads")]:
        with pytest.raises(ConfigError, match=msg):
            parse_config({**K25_TEXT, key: val})
    with pytest.raises(ConfigError, match="missing required key 'kv_lora_rank'"):
        parse_config({k: v for k, v in K25_TEXT.items() if k != "kv_lora_rank"})
    bad = k25_config([])
    bad["quantization_config"]["global_quant_config"]["weight"]["group_size"] = 128
    with pytest.raises(ConfigError, match="group_size 32"):
        parse_config(bad)
    with pytest.raises(ConfigError, match="quant_method 'gptq'"):
        parse_config({**K25_TEXT, "quantization_config": {"quant_method": "gptq"}})


def test_bf16_and_fp8_latent_cache(tmp_path):
    """Reduced-precision caches run the same model and stay close to the float32 cache."""
    from model_helpers import PagedDriver

    from k2bench.engine.model.loader import load_model
    from k2bench.engine.model.tiny import TinySpec, write_tiny_checkpoint

    d = write_tiny_checkpoint(tmp_path / "t", quant="bf16", seed=2, spec=TinySpec(layers=2))
    model, cfg = load_model(d, dtype="float32")
    prompt = [5, 9, 40, 41, 42, 100, 7, 300, 12, 13]
    ref = PagedDriver(model, cfg).prefill_all_logits(0, prompt)
    # Relative L2 error of the logits. bf16 keeps 8 mantissa bits; e4m3 keeps 3 (about 3.6% RMS rounding
    # of every cached value, unscaled), which measured 5-13% over seeds 0-5 of this model: bound 0.15.
    for dt, tol in ((torch.bfloat16, 0.01), (torch.float8_e4m3fn, 0.15)):
        drv = PagedDriver(model, cfg, cache_dtype=dt)
        out = drv.prefill_all_logits(0, prompt)
        assert drv.caches[0].dtype == dt and torch.isfinite(out).all()
        assert (out - ref).norm() < tol * ref.norm(), dt


def test_kimi_k2_yarn_frequencies_match_hf():
    """K2's real rope settings (theta 50000, factor 64, 4096 original positions, dim 64) against HF's YaRN."""
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from k2bench.engine.model.config import parse_config
    from k2bench.engine.model.layers import yarn_inv_freq

    cfg = parse_config(dict(K25_TEXT))
    ours, mscale = yarn_inv_freq(cfg.qk_rope_head_dim, cfg.rope)
    rs = K25_TEXT["rope_scaling"]
    hf_cfg = DeepseekV3Config(
        hidden_size=256, num_attention_heads=4, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        max_position_embeddings=262144,
        rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": rs["factor"],
                         "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                         "mscale": 1.0, "mscale_all_dim": 1.0},
    )
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg, "cpu")
    torch.testing.assert_close(ours, theirs.float(), atol=0, rtol=1e-6)
    assert mscale == attention_factor == 1.0
    assert not torch.allclose(ours[-4:], 1.0 / (50000.0 ** (torch.arange(56, 64, 2) / 64)))  # interpolated tail


@pytest.mark.parametrize("tp", [1, 4])
def test_real_k25_mxfp4_layout_on_meta(tp):
    """The full Kimi-K2.5 MXFP4 model built on the meta device: the checkpoint tensors it expects agree
    with the published layout (reference/MXFP4.md: 139,613 tensors including the vision tower's)."""
    from k2bench.engine.kernels import get_backend
    from k2bench.engine.model.config import parse_config
    from k2bench.engine.model.deepseek import DeepseekV3ForCausalLM
    from k2bench.engine.model.parallel import Parallel

    cfg = parse_config(k25_config(["language_model.lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"]))
    par = Parallel(rank=tp - 1, size=tp, dtype=torch.bfloat16, a4w4=True, backend=get_backend("torch"))
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(cfg, par)
    specs = {s.name: s for s in model.checkpoint_specs()}
    per_moe_layer = 7 + 2 + 2 + 384 * 3 * 2 + 3 * 2  # attention, norms, router, experts, shared expert
    assert len(specs) == (7 + 2 + 3 * 2) + 60 * per_moe_layer + 3  # + embed, final norm, lm_head
    e = "language_model.model.layers.5.mlp.experts.100"
    assert specs[f"{e}.gate_proj.weight"].shape == (2048, 3584)
    assert specs[f"{e}.gate_proj.weight_scale"].shape == (2048, 224)
    assert specs[f"{e}.down_proj.weight"].shape == (7168, 1024)
    assert specs[f"{e}.down_proj.weight_scale"].shape == (7168, 64)
    assert specs["language_model.model.layers.0.self_attn.kv_b_proj.weight"].kind == "float"
    assert specs["language_model.lm_head.weight"].shape == (163840, 7168)
    experts = model.layers[5].mlp.experts
    assert experts.w13.shape == (384, 2 * 2048 // tp, 3584) and experts.w2.shape == (384, 7168, 1024 // tp)
    assert model.layers[5].self_attn.heads == 64 // tp
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if tp == 1:  # the export is "about 559 GB" including the vision tower
        assert 550e9 < weight_bytes < 559.5e9
