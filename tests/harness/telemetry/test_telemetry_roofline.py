"""Roofline: parameter counts against published model sizes and a checkpoint's own tensors, a limit
point against hand arithmetic, the hardware table, and the curve's shape."""

from __future__ import annotations

import json
import math
import statistics
import struct
from pathlib import Path

import pytest

from k2bench.errors import UserError
from k2bench.harness.telemetry import roofline as rl

DEEPSEEK_V3 = dict(hidden_size=7168, num_hidden_layers=61, num_attention_heads=128, intermediate_size=18432,
                   moe_intermediate_size=2048, n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1,
                   first_k_dense_replace=3, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                   qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280)
KIMI_K2 = {**DEEPSEEK_V3, "num_attention_heads": 64, "n_routed_experts": 384, "first_k_dense_replace": 1,
           "vocab_size": 163840}


def test_parameter_counts_match_the_published_model_sizes():
    # DeepSeek-V3: 671B total, 37B activated per token; Kimi K2: 1T total, 32B activated (model cards)
    ds = rl.param_counts(DEEPSEEK_V3)
    assert ds["total"] / 1e9 == pytest.approx(671, rel=0.01)
    assert ds["active"] / 1e9 == pytest.approx(37, rel=0.03)
    kimi = rl.param_counts({"text_config": KIMI_K2})  # multimodal configs nest the language model
    assert kimi["total"] / 1e12 == pytest.approx(1.03, rel=0.01)
    assert kimi["active"] / 1e9 == pytest.approx(32, rel=0.03)


@pytest.mark.engine
def test_parameter_count_matches_a_checkpoints_own_tensors(tmp_path):
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    model = write_tiny_checkpoint(tmp_path / "tiny", quant="bf16")
    cfg = json.loads((model / "config.json").read_text())
    stored = 0
    for f in model.glob("*.safetensors"):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        stored += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__" and len(v["shape"]) == 2)
    assert rl.param_counts(cfg)["total"] == stored
    assert sum(rl.tensor_bytes(model).values()) >= 2 * stored  # bf16: two bytes per parameter, norms besides


def _dense_cfg() -> dict:
    return dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=1, kv_lora_rank=448, qk_rope_head_dim=64,
                qk_nope_head_dim=8, v_head_dim=8, vocab_size=100)


def test_a_limit_point_by_hand():
    sizes = {"model.layers.0.mlp.up_proj.weight": 4_000_000_000, "model.layers.0.input_layernorm.weight": 1_000_000}
    hw = rl.Hardware(name="test", hbm_gbs=1000.0, tflops=1e9, source="test")  # compute practically free
    p = rl.limit(sizes, _dense_cfg(), hw, tp=2, batch=4, isl=999, osl=2, kv_bytes=2)
    # per rank: half the split tensor + the whole norm + 4 seqs x 1000 ctx x 512 latent x 2 bytes x 1 layer
    step_s = (2_000_000_000 + 1_000_000 + 4 * 1000 * 512 * 2) / 1000e9
    assert p["bound"] == "memory"
    assert p["step_ms"] == pytest.approx(step_s * 1e3)
    assert p["interactivity"] == pytest.approx(1 / step_s)
    assert p["tput_per_gpu"] == pytest.approx(4 * 1001 / (2 * step_s) / 2, rel=1e-6)  # prefill ~0 at this peak
    slow = rl.limit(sizes, _dense_cfg(), rl.Hardware("slow", 1000.0, 1e-6, "t"), tp=2, batch=4, isl=999, osl=2)
    assert slow["bound"] == "compute" and slow["step_ms"] > p["step_ms"]


def test_the_hardware_table_and_a_measured_bandwidth():
    h200 = rl.hardware("NVIDIA H200")
    assert (h200.name, h200.hbm_gbs, h200.tflops) == ("H200", 4800.0, 989.4)
    assert "nvidia.com" in h200.source
    measured = rl.hardware("NVIDIA H200", bandwidth_gbs=4300)
    assert measured.hbm_gbs == 4300.0 and "measured" in measured.source
    assert rl.hardware("AMD Instinct MI355X", dtype="mxfp4").tflops > rl.hardware("AMD Instinct MI355X").tflops
    assert rl.hardware("cpu: Intel Xeon") is None
    with pytest.raises(UserError, match="no fp4 peak"):
        rl.hardware("NVIDIA H100 80GB HBM3", dtype="fp4")


def test_the_curve_trades_interactivity_for_throughput_and_levels_get_their_share():
    sizes = {f"model.layers.1.mlp.experts.{e}.up_proj.weight": 10_000_000 for e in range(384)}
    sizes["model.layers.1.self_attn.o_proj.weight"] = 50_000_000
    cfg = {**KIMI_K2, "num_hidden_layers": 2}
    hw = rl.hardware("AMD Instinct MI355X")
    points = rl.curve(sizes, cfg, hw, tp=4, isl=8192, osl=1024, max_batch=256)
    assert [p["concurrency"] for p in points] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert all(b["tput_per_gpu"] > a["tput_per_gpu"] for a, b in zip(points, points[1:], strict=False))
    assert all(b["interactivity"] < a["interactivity"] for a, b in zip(points, points[1:], strict=False))
    level = {"tput_per_gpu": points[2]["tput_per_gpu"] / 4, "interactivity": {"median": points[2]["interactivity"] / 2}}
    assert rl.share_of_limit(level, points[2]) == {"pct_tput": pytest.approx(25.0), "pct_interactivity": pytest.approx(50.0)}


def test_configs_and_checkpoints_the_roofline_cannot_use_are_user_errors(tmp_path: Path):
    with pytest.raises(UserError, match="DeepSeek-V3-style config"):
        rl.param_counts({"hidden_size": 8, "num_hidden_layers": 1})
    with pytest.raises(UserError, match="no \\*.safetensors"):
        rl.tensor_bytes(tmp_path)


@pytest.mark.engine
def test_a_runs_roofline_from_its_model_folder_and_hardware(tmp_path):
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    model = write_tiny_checkpoint(tmp_path / "tiny", quant="mxfp4")
    roof, note = rl.for_run(model, "NVIDIA H200", tp=1, isl=64, osl=16, levels=(3, 12), max_batch=16)
    assert note is None and roof["hardware"] == "H200" and roof["hbm_gbs"] == 4800.0
    assert [p["concurrency"] for p in roof["points"]] == [1, 2, 3, 4, 8, 12, 16]
    level = {"concurrency": 12, "tput_per_gpu": 10.0, "interactivity": {"median": 5.0}}
    bound = roof["points"][5]
    assert rl.level_share(roof, level) == {"pct_tput": pytest.approx(1000.0 / bound["tput_per_gpu"]),
                                           "pct_interactivity": pytest.approx(500.0 / bound["interactivity"])}
    assert rl.level_share(roof, {"concurrency": 5}) is None and rl.level_share(None, level) is None
    off, why = rl.for_run(model, "cpu: AMD EPYC", tp=1, isl=64, osl=16)
    assert off is None and "not in hardware.toml" in why
    assert rl.for_run(None, "NVIDIA H200", tp=1, isl=64, osl=16)[1].startswith("roofline off: no local model")


def _simulate_one_wave(n: int, osl: int, t_p: float, d: float) -> dict:
    """A one-wave level played step by step, independently of the closed form: prompts prefilled one per
    step of t_p, every stream already decoding gets a token in each step, then decode steps of d."""
    assert osl > n  # no stream finishes among the prefill steps
    t, first, tokens, done = 0.0, {}, dict.fromkeys(range(n), 0), {}
    for k in range(n):  # the prefill steps
        t += t_p
        for j in first:
            tokens[j] += 1
        first[k] = t
        tokens[k] = 1
    while len(done) < n:  # decode steps
        t += d
        for j in range(n):
            if j not in done:
                tokens[j] += 1
                if tokens[j] == osl:
                    done[j] = t
    tpot = [(done[j] - first[j]) / (osl - 1) for j in range(n)]
    return {"concurrency": n, "num_prompts": n, "mode": "closed",
            "ttft_ms": {"median": statistics.median(first.values())}, "tpot_ms": {"median": statistics.median(tpot)}}


@pytest.mark.parametrize("n,osl,t_p,d", [(128, 1024, 86.5, 7.3), (64, 1024, 85.0, 5.5), (5, 64, 40.0, 2.0),
                                         (4, 1024, 70.0, 1.9)])
def test_one_wave_reads_prefill_speed_and_decode_step_back_from_a_simulated_level(n, osl, t_p, d):
    point = _simulate_one_wave(n, osl, t_p, d)
    wave = rl.one_wave_stall(point, osl)
    assert wave["prompt_ms"] == pytest.approx(t_p)
    assert rl.one_wave_decode_ms(point["tpot_ms"]["median"], wave) == pytest.approx(d)
    # with the decode step at d, the bound is the level's TPOT; a faster floor gives a lower bound
    assert rl.one_wave_bound_ms(d, wave) == pytest.approx(point["tpot_ms"]["median"])
    assert rl.one_wave_bound_ms(d / 2, wave) < point["tpot_ms"]["median"]


def test_levels_that_are_not_one_wave_get_no_stall():
    point = {"concurrency": 32, "num_prompts": 32, "mode": "closed", "ttft_ms": {"median": 1000.0}}
    assert rl.one_wave_stall(point, 1024)["stall_ms"] == pytest.approx(15.5 * (1000 / 16.5) / 1023)
    assert rl.one_wave_stall({**point, "num_prompts": 64}, 1024) == {}  # two waves and more
    assert rl.one_wave_stall({**point, "mode": "rate"}, 1024) == {}  # arrivals spread in time
    assert rl.one_wave_stall({**point, "ttft_ms": {"median": None}}, 1024) == {}
    assert rl.one_wave_stall(point, 16) == {}  # more prefill steps than gaps: the model does not hold
