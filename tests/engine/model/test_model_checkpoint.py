"""Checkpoint loading: strictness (missing / unused / mis-shaped tensors are named), the K2.5 wrapper,
the tiny generator and its CLI, config validation, backend registry."""

from __future__ import annotations

import json

import pytest
import torch
from model_helpers import PagedDriver, rewrite_checkpoint

pytestmark = pytest.mark.engine

PROMPT = [5, 9, 40, 41, 42, 100, 7, 300]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from k2bench.engine.model.tiny import TinySpec, write_tiny_checkpoint

    d = tmp_path_factory.mktemp("tiny_mx")
    return write_tiny_checkpoint(d, quant="mxfp4", seed=3, spec=TinySpec(layers=2))


def _load(d, **kw):
    from k2bench.engine.model.loader import load_model

    return load_model(d, dtype="float32", **kw)


def test_tiny_checkpoint_format(tiny):
    from safetensors import safe_open
    from tokenizers import Tokenizer

    from k2bench.engine.model.config import load_config

    index = json.loads((tiny / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) == 2
    name = "model.layers.1.mlp.experts.0.gate_proj"
    f = index["weight_map"][f"{name}.weight"]
    with safe_open(str(tiny / f), "pt") as fh:
        assert fh.get_slice(f"{name}.weight").get_dtype() == "U8"
        assert fh.get_slice(f"{name}.weight").get_shape() == [128, 64]  # [inter, hidden/2]
        assert fh.get_slice(f"{name}.weight_scale").get_shape() == [128, 4]  # [inter, hidden/32]
    assert "model.layers.0.self_attn.kv_b_proj.weight_scale" not in index["weight_map"]
    assert "model.layers.0.mlp.down_proj.weight_scale" in index["weight_map"]  # dense MLP is MXFP4
    assert "lm_head.weight_scale" not in index["weight_map"]
    cfg = load_config(tiny)
    assert cfg.quant is not None and cfg.quant.dynamic_input
    assert cfg.rope.kind == "yarn" and cfg.n_group > 1 and cfg.q_lora_rank
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    ids = tok.encode("Hello, how are you today?").ids
    assert tok.decode(ids) == "Hello, how are you today?"
    assert tok.token_to_id("<|eos|>") == cfg.eos_token_id
    tc = json.loads((tiny / "tokenizer_config.json").read_text())
    assert "<|im_assistant|>" in tc["chat_template"] and tc["eos_token"] == "<|eos|>"
    model, cfg2 = _load(tiny)
    assert model.quant_mode == "a4w4"
    logits = PagedDriver(model, cfg2).prefill_all_logits(0, PROMPT)
    assert logits.shape == (len(PROMPT), cfg.vocab_size) and torch.isfinite(logits).all()


def test_missing_tensor_is_named(tiny, tmp_path):
    from k2bench.engine.model.checkpoint import CheckpointError

    gone = "model.layers.1.mlp.experts.3.up_proj.weight_scale"
    d = rewrite_checkpoint(tiny, tmp_path / "c", lambda s: {k: v for k, v in s.items() if k != gone})
    with pytest.raises(CheckpointError, match=f"missing tensors: {gone}"):
        _load(d)


def test_unused_tensor_is_named(tiny, tmp_path):
    from k2bench.engine.model.checkpoint import CheckpointError

    extra = "model.layers.1.mlp.surprise.weight"
    d = rewrite_checkpoint(tiny, tmp_path / "c", lambda s: {**s, extra: torch.zeros(3)})
    with pytest.raises(CheckpointError, match=f"not used by the model: {extra}"):
        _load(d)


def test_misshaped_and_wrong_kind_tensor_named(tiny, tmp_path):
    from k2bench.engine.model.checkpoint import CheckpointError

    name = "model.layers.0.self_attn.q_b_proj.weight"
    d = rewrite_checkpoint(tiny, tmp_path / "a", lambda s: {**s, name: torch.zeros(7, 7, dtype=torch.bfloat16)})
    with pytest.raises(CheckpointError, match=rf"{name} .*shape \[7, 7\].*expects \[192, 96\]"):
        _load(d)
    packed = "model.layers.1.mlp.experts.0.down_proj.weight"
    d = rewrite_checkpoint(tiny, tmp_path / "b", lambda s: {**s, packed: s[packed].float()})
    with pytest.raises(CheckpointError, match=rf"{packed} .*dtype F32.*MXFP4"):
        _load(d)


def test_mtp_layers_skipped_and_missing_files_named(tiny, tmp_path):
    from k2bench.engine.model.checkpoint import CheckpointError

    d = rewrite_checkpoint(tiny, tmp_path / "mtp", lambda s: {**s, "model.layers.2.eh_proj.weight": torch.zeros(4, 4)})
    _load(d)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        _load(d)


def test_k25_wrapper_matches_plain(tiny, tmp_path):
    def wrap_names(s):
        out = {}
        for k, v in s.items():
            if k.startswith("model."):
                out["language_model." + k] = v
            else:
                out["language_model." + k] = v  # lm_head
        out["vision_tower.patch_embed.weight"] = torch.zeros(8, 3)
        out["mm_projector.proj.0.weight"] = torch.zeros(4, 8)
        return out

    def wrap_config(c):
        q = c.pop("quantization_config")
        q["exclude"] = ["language_model.lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$", "re:vision_tower.*"]
        return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                "text_config": c, "vision_config": {"hidden_size": 8}, "quantization_config": q}

    d = rewrite_checkpoint(tiny, tmp_path / "k25", wrap_names, wrap_config, shards=3)
    wrapped, wcfg = _load(d)
    assert wcfg.model_prefix == "language_model.model"
    plain, pcfg = _load(tiny)
    a = PagedDriver(wrapped, wcfg).prefill_all_logits(0, PROMPT)
    b = PagedDriver(plain, pcfg).prefill_all_logits(0, PROMPT)
    assert torch.equal(a, b)


def test_config_errors_and_quant_modes(tiny, tmp_path):
    from k2bench.engine.kernels import get_backend
    from k2bench.engine.model.config import ConfigError
    from k2bench.errors import UserError

    m, _ = _load(tiny, quant_mode="w4")
    assert m.quant_mode == "w4"
    with pytest.raises(ConfigError, match="valid: auto, w4, a4w4"):
        _load(tiny, quant_mode="int8")
    with pytest.raises(UserError, match="valid: auto, torch, triton$"):
        _load(tiny, backend="cutlass")
    with pytest.raises(ValueError, match="valid: auto, torch"):
        get_backend("nope")
    assert get_backend("auto", "cpu").name == "torch"
    with pytest.raises(ConfigError, match="not divisible by tp=3"):
        _load(tiny, tp_rank=0, tp_size=3)
    d = rewrite_checkpoint(tiny, tmp_path / "sm", lambda s: s, lambda c: {**c, "scoring_func": "softmax"})
    with pytest.raises(ConfigError, match="scoring_func 'softmax'"):
        _load(d)
    with pytest.raises(ConfigError, match="no config.json"):
        _load(tmp_path)


def test_bf16_checkpoint_and_cli(tmp_path):
    from k2bench.harness.cli import main

    out = tmp_path / "cli_tiny"
    assert main(["engine", "tiny", "--out", str(out), "--quant", "bf16", "--layers", "2", "--seed", "1"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["num_hidden_layers"] == 2
    m, c = _load(out)
    assert m.quant_mode == "none"
    with pytest.raises(Exception, match="needs an MXFP4 checkpoint"):
        _load(out, quant_mode="a4w4")
    assert main(["engine", "tiny", "--out", str(out), "--layers", "0"]) == 2


@pytest.mark.parametrize("tp_dim", [0, 1])
def test_weight_loader_full_tensor_equals_sliced_read(tp_dim):
    """A parallel linear's weight_loader narrows a full tensor itself; the checkpoint loader instead
    reads only `part` from disk. Both must land the same bytes for every rank."""
    from k2bench.engine.kernels import get_backend
    from k2bench.engine.model.mxfp4 import quantize_mxfp4
    from k2bench.engine.model.parallel import Linear, Parallel

    full = torch.randn(2 * 64, 256)  # merged gate/up: two pieces of 64 rows
    packed, scales = quantize_mxfp4(full)
    for rank in range(2):
        par = Parallel(rank=rank, size=2, backend=get_backend("torch"))
        a = Linear(256, 128, par, tp_dim=tp_dim, quantized=True, out_splits=(64, 64))
        b = Linear(256, 128, par, tp_dim=tp_dim, quantized=True, out_splits=(64, 64))
        for piece in (0, 1):
            rows = slice(piece * 64, (piece + 1) * 64)
            for param_a, spec, src in zip((a.weight, a.weight_scale), b.specs("x", piece),
                                          (packed[rows], scales[rows]), strict=True):
                a.weight_loader(param_a, src, piece)
                dim, start, length = spec.part
                spec.load(src.narrow(dim, start, length))
        assert torch.equal(a.weight, b.weight) and torch.equal(a.weight_scale, b.weight_scale)
        x = torch.randn(3, a.local_in)
        y = a(x)
        assert y.shape == (3, sum(a.local_splits))
