"""E-divisive change points: the statistic against a naive formula, and the known step of a fixture."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from analysis_data import frame, load_fixture

from k2bench.harness.analysis import changepoints as cp


def _naive_q(x: np.ndarray, tau: int) -> float:
    a, b = x[:tau], x[tau:]
    m, k = len(a), len(b)
    cross = sum(abs(i - j) for i in a for j in b) * 2 / (m * k)
    wa = sum(abs(i - j) for i, j in itertools.combinations(a, 2)) / (m * (m - 1) / 2)
    wb = sum(abs(i - j) for i, j in itertools.combinations(b, 2)) / (k * (k - 1) / 2)
    return m * k / (m + k) * (cross - wa - wb)


def test_energy_split_matches_naive_formula():
    rng = np.random.default_rng(3)
    x = np.r_[rng.normal(0, 1, 12), rng.normal(2, 1, 9)]
    tau, q = cp.energy_split(x, min_size=3)
    naive = {t: _naive_q(x, t) for t in range(3, len(x) - 2)}
    best = max(naive, key=naive.get)
    assert tau == best
    assert q == pytest.approx(naive[best])


def test_step_in_60_run_fixture_found_at_the_right_commit():
    fx = load_fixture("step60")
    pts = frame(fx["runs"])
    rows = cp.history_change_points(pts, ("tput_per_gpu",))
    exp = fx["expected"]
    assert {r["concurrency"] for r in rows} == {4, 8, 16, 32, 64}  # one per level, nothing else
    for r in rows:
        assert r["commit"] == exp["commit"]
        assert r["run_id"] == exp["index"] + 1  # frame() numbers runs from 1
        assert r["rel_change"] == pytest.approx(-0.12, abs=0.03)
        assert r["p_value"] < cp.DEFAULT_PVALUE


def test_pure_noise_rarely_gives_change_points():
    flagged = sum(bool(cp.detect(np.random.default_rng(seed).normal(100, 3, 60))) for seed in range(100))
    assert flagged <= 4  # the split is chosen before it is tested; ~1.5% measured, see the module doc


def test_two_steps_in_a_long_history_both_found():
    rng = np.random.default_rng(5)
    x = np.r_[rng.normal(100, 2, 80), rng.normal(92, 2, 30), rng.normal(97, 2, 50)]
    assert [c.index for c in cp.detect(x)] == [80, 110]


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        cp.detect([1.0, float("nan"), 2.0])
    with pytest.raises(ValueError):
        cp.detect([1.0] * 10, window=4)
