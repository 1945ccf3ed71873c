"""The engine against an independent implementation: HF transformers' DeepseekV3ForCausalLM.

A tiny random DeepSeek-V3 (q_lora, kv_lora, YaRN with mscale != mscale_all_dim so both the cos/sin
factor and the softmax-scale correction matter, group-limited routing with a non-zero correction
bias) is saved with save_pretrained and loaded by the engine. HF's implementation agrees with the
DeepSeek-V3 reference code on every detail exercised here (interleaved rope, yarn ramp with
floor/ceil truncation, cos/sin * mscale(mscale)/mscale(mscale_all_dim), softmax scale *
mscale(mscale_all_dim)^2, top-2-sum group scores, bias for selection only); the one known
difference (HF ignores `mscale` when `mscale_all_dim` is absent) is outside this config.
"""

from __future__ import annotations

import json

import pytest
import torch
from model_helpers import PagedDriver, add_quark_config, hf_greedy, hf_logits, hf_tiny_model

pytestmark = pytest.mark.engine

PROMPTS = [[3, 17, 42, 8, 91, 5, 23], [60, 61, 62], [7] * 11, [88, 12, 33, 45, 2, 9, 71, 50, 19, 4, 6, 30, 77]]
STEPS = 6


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    model = hf_tiny_model(seed=0)
    d = tmp_path_factory.mktemp("hf_ds3")
    model.save_pretrained(d)
    return d, model


def test_prefill_logits_match_hf(hf_dir):
    from k2bench.engine.model.loader import load_model

    d, ref = hf_dir
    model, cfg = load_model(d, dtype="float32")
    assert cfg.softmax_scale != cfg.qk_head_dim**-0.5  # the YaRN correction is in play
    drv = PagedDriver(model, cfg)
    for i, p in enumerate(PROMPTS):
        ours = drv.prefill_all_logits(i, p)
        theirs = hf_logits(ref, p)
        torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


def test_greedy_paged_prefill_decode_match_hf(hf_dir):
    from k2bench.engine.model.loader import load_model

    d, ref = hf_dir
    model, cfg = load_model(d, dtype="float32")
    expected = [hf_greedy(ref, p, STEPS)[0] for p in PROMPTS]
    # all prompts batched in one prefill step, then decoded together through the paged cache
    assert PagedDriver(model, cfg, seed=1).greedy(PROMPTS, STEPS) == expected
    # chunked prefill (3 tokens per sequence per step, mixed with other sequences' chunks)
    assert PagedDriver(model, cfg, seed=2, block_size=2).greedy(PROMPTS, STEPS, chunk=3) == expected


def test_long_prefill_in_query_slices_matches_hf(hf_dir, monkeypatch):
    from k2bench.engine.kernels import torch_backend
    from k2bench.engine.model.loader import load_model

    d, ref = hf_dir
    monkeypatch.setattr(torch_backend, "SCORE_BUDGET", 64)  # 16-query slices with causal key cut-off
    model, cfg = load_model(d, dtype="float32")
    prompt = [(7 * i + 3) % 96 for i in range(45)]
    drv = PagedDriver(model, cfg, seed=4)
    torch.testing.assert_close(drv.prefill_all_logits(0, prompt), hf_logits(ref, prompt), atol=2e-4, rtol=1e-4)
    # a second chunk on top of cached context, also sliced
    more = [(5 * i + 1) % 96 for i in range(37)]
    last = drv.step([(0, more)])[0]
    torch.testing.assert_close(last, hf_logits(ref, prompt + more)[-1], atol=2e-4, rtol=1e-4)


def test_decode_logits_match_hf(hf_dir):
    from k2bench.engine.model.loader import load_model

    d, ref = hf_dir
    model, cfg = load_model(d, dtype="float32")
    drv = PagedDriver(model, cfg, seed=3)
    p = PROMPTS[0]
    drv.step([(0, p)])
    toks = list(p)
    for t in (11, 12, 13):
        ours = drv.step([(0, [t])])[0]
        toks.append(t)
        torch.testing.assert_close(ours, hf_logits(ref, toks)[-1], atol=2e-4, rtol=1e-4)


def test_mxfp4_experts_match_dequantised_hf(tmp_path, hf_dir):
    """Quantise the MLP/expert weights to MXFP4, write a Quark-format checkpoint, compare with HF on the
    dequantised weights (W4: activations unquantised, so the only error is float32 rounding)."""
    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM

    from k2bench.engine.model.config import parse_config
    from k2bench.engine.model.loader import load_model
    from k2bench.engine.model.mxfp4 import dequantize_mxfp4
    from k2bench.engine.model.tiny import quantize_state, save_sharded

    src, _ = hf_dir
    state = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(f)))
    qdir = tmp_path / "quark"
    qdir.mkdir()
    (qdir / "config.json").write_text((src / "config.json").read_text())
    cfg_json = add_quark_config(qdir, dynamic_input=True)
    quant = parse_config(cfg_json).quant
    qstate = quantize_state(state, quant.is_quantized)
    n_q = sum(1 for k in qstate if k.endswith(".weight_scale"))
    assert n_q == 3 + 2 * (8 * 3 + 3)  # dense MLP + (8 experts x 3 + shared x 3) per MoE layer
    assert "model.layers.0.self_attn.q_b_proj.weight_scale" not in qstate
    assert "model.layers.1.mlp.gate.weight_scale" not in qstate
    save_sharded(qstate, qdir, shards=3)

    # the reference: HF on the dequantised weights
    ddir = tmp_path / "deq"
    ddir.mkdir()
    (ddir / "config.json").write_text((src / "config.json").read_text())
    deq = {}
    for k, v in qstate.items():
        if k.endswith(".weight_scale"):
            continue
        sk = k[: -len(".weight")] + ".weight_scale"
        deq[k] = dequantize_mxfp4(v, qstate[sk]) if sk in qstate else v
    save_sharded(deq, ddir, shards=1)
    ref = DeepseekV3ForCausalLM.from_pretrained(ddir, attn_implementation="eager").float().eval()

    model, cfg = load_model(qdir, dtype="float32", quant_mode="w4")
    assert model.quant_mode == "w4"
    assert model.layers[1].mlp.experts.w13.dtype == torch.uint8  # really stored packed
    drv = PagedDriver(model, cfg)
    for i, p in enumerate(PROMPTS[:3]):
        torch.testing.assert_close(drv.prefill_all_logits(i, p), hf_logits(ref, p), atol=2e-4, rtol=1e-4)
    expected = [hf_greedy(ref, p, STEPS)[0] for p in PROMPTS]
    assert PagedDriver(model, cfg, seed=5).greedy(PROMPTS, STEPS) == expected

    # A4W4 (what auto picks for this config) changes the numbers, but only a little
    model4, _ = load_model(qdir, dtype="float32")
    assert model4.quant_mode == "a4w4"
    a4 = PagedDriver(model4, cfg).prefill_all_logits(0, PROMPTS[0])
    w4 = PagedDriver(model, cfg).prefill_all_logits(0, PROMPTS[0])
    assert not torch.allclose(a4, w4, atol=1e-4)
    assert (a4 - w4).abs().max() < 0.25 * w4.abs().max()
    assert json.loads((qdir / "model.safetensors.index.json").read_text())["weight_map"]


def test_variant_without_q_lora_yarn_interleave_groups(tmp_path):
    """The other branches: q_proj instead of q_lora, plain rope in halves (rope_interleave=false),
    one expert group, tied embeddings, two dense layers, no top-k renormalisation."""
    from k2bench.engine.model.loader import load_model

    ref = hf_tiny_model(
        seed=4, q_lora_rank=None, rope_interleave=False, n_group=1, topk_group=1, first_k_dense_replace=2,
        num_hidden_layers=4, tie_word_embeddings=True, norm_topk_prob=False,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
    )
    ref.save_pretrained(tmp_path)
    model, cfg = load_model(tmp_path, dtype="float32")
    assert cfg.q_lora_rank is None and cfg.tie_word_embeddings and cfg.rope.kind == "default"
    assert model.lm_head is None and model.layers[1].mlp.__class__.__name__ == "DenseMLP"
    drv = PagedDriver(model, cfg)
    for i, p in enumerate(PROMPTS[:2]):
        torch.testing.assert_close(drv.prefill_all_logits(i, p), hf_logits(ref, p), atol=2e-4, rtol=1e-4)
    expected = [hf_greedy(ref, p, 4)[0] for p in PROMPTS]
    assert PagedDriver(model, cfg, seed=9).greedy(PROMPTS, 4, chunk=4) == expected
