"""The sweep's duration estimate prices a level as batch decode, checked against known level costs:
hand-computed figures, and the design card's recorded H200 levels (bench/results/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2bench.harness.plan import estimate
from k2bench.harness.plan.estimate import Level, Speed

CARD = Path(__file__).parents[2] / "bench" / "results" / "2026-12-01_h200_issue11_card" / "card_sweep.json"


def test_a_level_costs_its_waves_of_prefill_and_batch_decode_steps():
    """128 requests of 1024 output tokens at concurrency 32: 4 waves, each 32 prompts' prefill and
    1024 steps at batch 32 (not 128 x 1024 single-request TPOTs)."""
    speed = Speed(prefill_s=0.1, step_s=0.002, per_seq_s=0.0001)
    assert speed.step_at(32) == pytest.approx(0.002 + 31 * 0.0001)
    expected = 4 * (32 * 0.1 + 1024 * 0.0051)
    assert estimate.level_seconds(Level(32, 128), 1024, speed) == pytest.approx(expected)
    assert estimate.level_seconds(Level(32, 128), 1024, speed) < 128 * 1024 * 0.002 / 4


def test_the_probe_gives_prefill_share_step_and_per_sequence_cost():
    lone = {"ttft_ms": 1800.0, "tpot_ms": 2.0}  # a cold first request: its TTFT is not used
    batch = [{"ttft_ms": t, "tpot_ms": 2.3} for t in (200.0, 300.0, 400.0, 500.0)]
    speed = estimate.speed_from_probe(lone, batch)
    assert speed.prefill_s == pytest.approx(0.125)  # the batch's last first token / 4
    assert speed.step_s == pytest.approx(0.002) and speed.per_seq_s == pytest.approx(0.0001)
    # a lone request alone: its own figures, no per-sequence cost; no latencies: no estimate
    assert estimate.speed_from_probe(lone, []) == Speed(1.8, 0.002)
    assert estimate.speed_from_probe({"ttft_ms": None, "tpot_ms": None}, batch) is None


def _card_points() -> list[dict]:
    return json.loads(CARD.read_text())["points"]


def test_the_design_cards_recorded_levels_are_estimated_within_the_stated_error():
    """The design card's sweep on one H200 (levels 4, 32, 128, one wave each): its levels took 30.4 s
    and the old estimate printed 'about 5 min'. A probe batch of 4 measures what the c=4 level did;
    with a lone step between 1.9 and 2.23 ms (the c=4 step) the new estimate is 28..45 s."""
    points = _card_points()
    took = sum(p["duration_s"] for p in points)
    assert took == pytest.approx(30.4, abs=0.1)
    c4 = points[0]
    batch = [{"ttft_ms": c4["ttft_ms"][k], "tpot_ms": c4["tpot_ms"]["median"]} for k in ("median",) * 3 + ("p99",)]
    levels = [Level(p["concurrency"], p["num_prompts"]) for p in points]
    for lone_step_ms in (1.9, c4["tpot_ms"]["median"]):
        speed = estimate.speed_from_probe({"ttft_ms": 1800.0, "tpot_ms": lone_step_ms}, batch)
        seconds = estimate.sweep_seconds(levels, 1024, speed)
        assert 0.9 * took < seconds < 1.5 * took, (lone_step_ms, seconds)
    # the old estimate (c x a lone request's TTFT + OSL x its TPOT) from the same cold probe: ten times over
    old = sum(lv.waves * (lv.concurrency * 1.8 + 1024 * 0.0019) for lv in levels)
    assert old > 9 * took


def test_after_two_levels_the_eta_follows_the_measured_step_line():
    """From the card's levels 4 and 32, the c=128 level (20.4 s) is estimated within 1.6x."""
    points = _card_points()
    speed = estimate.speed_from_points(points[:2])
    assert speed.per_seq_s > 0
    predicted = estimate.level_seconds(Level(128, 128), 1024, speed)
    assert 0.8 * points[2]["duration_s"] < predicted < 1.6 * points[2]["duration_s"]
    one = estimate.speed_from_points(points[:1], before=Speed(0.1, 0.002, 0.0001))
    assert one.per_seq_s == 0.0001 and one.step_at(4) == pytest.approx(points[0]["tpot_ms"]["median"] / 1000)
