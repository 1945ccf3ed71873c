"""Arrival schedules of rate levels (k2bench.harness.load.schedule), against scipy's distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from k2bench.harness.load import schedule


def gaps(offsets: list[float]) -> np.ndarray:
    return np.diff(np.asarray(offsets))


def test_poisson_gaps_pass_ks_against_the_exponential_at_the_requested_mean() -> None:
    rate = 8.0
    offsets = schedule.arrival_offsets(4000, rate, burstiness=1.0, seed=11)
    assert offsets[0] == 0.0 and len(offsets) == 4000
    result = stats.kstest(gaps(offsets), "expon", args=(0, 1 / rate))
    assert result.pvalue > 0.01
    # and the test can tell: the same gaps are not exponential at twice the mean
    assert stats.kstest(gaps(offsets), "expon", args=(0, 2 / rate)).pvalue < 1e-6


@pytest.mark.parametrize("k", [0.5, 1.0, 4.0])
def test_gamma_gaps_have_the_requested_mean_and_coefficient_of_variation(k: float) -> None:
    rate = 20.0
    g = gaps(schedule.arrival_offsets(20001, rate, burstiness=k, seed=3))
    assert g.mean() == pytest.approx(1 / rate, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(1 / math.sqrt(k), rel=0.05)
    assert stats.kstest(g, "gamma", args=(k, 0, 1 / (rate * k))).pvalue > 0.01


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    a = schedule.arrival_offsets(500, 5.0, burstiness=2.0, seed=7, ramp_up_s=3.0)
    assert a == schedule.arrival_offsets(500, 5.0, burstiness=2.0, seed=7, ramp_up_s=3.0)
    assert a != schedule.arrival_offsets(500, 5.0, burstiness=2.0, seed=8, ramp_up_s=3.0)
    assert a[:100] == schedule.arrival_offsets(100, 5.0, burstiness=2.0, seed=7, ramp_up_s=3.0)  # prefix-stable


def test_infinite_rate_sends_everything_at_once() -> None:
    assert schedule.arrival_offsets(5, math.inf) == [0.0] * 5


def test_duration_form_holds_what_fits_and_is_capped_by_the_count() -> None:
    full = schedule.arrival_offsets(None, 10.0, seed=5, duration_s=30.0)
    assert full and max(full) < 30.0 and len(full) == pytest.approx(300, rel=0.2)
    assert full == schedule.arrival_offsets(len(full), 10.0, seed=5)  # the count form's prefix
    assert schedule.arrival_offsets(50, 10.0, seed=5, duration_s=30.0) == full[:50]


def test_ramp_up_grows_the_rate_linearly() -> None:
    """With a ramp of R s to rate r, the expected arrivals by t < R are r t^2 / (2R): a quarter of
    the ramp's r R / 2 by R / 2, and the steady rate after R."""
    rate, ramp, n = 200.0, 10.0, 6000
    offsets = np.asarray(schedule.arrival_offsets(n, rate, seed=1, ramp_up_s=ramp))
    in_ramp = (offsets < ramp).sum()
    assert in_ramp == pytest.approx(rate * ramp / 2, rel=0.05)
    assert (offsets < ramp / 2).sum() == pytest.approx(rate * ramp / 8, rel=0.1)
    after = gaps(offsets[offsets >= ramp])
    assert after.mean() == pytest.approx(1 / rate, rel=0.05)


def test_level_schedule_counts_ramp_arrivals_as_warmup() -> None:
    offsets, warm = schedule.level_schedule(10.0, 20, 2, seed=4, ramp_up_s=5.0)
    assert warm == sum(1 for t in offsets if t < 5.0) > 2 and len(offsets) == warm + 20
    offsets, warm = schedule.level_schedule(10.0, 20, 2, seed=4)
    assert warm == 2 and len(offsets) == 22
    offsets, warm = schedule.level_schedule(10.0, None, 3, seed=4, duration_s=2.0)
    assert offsets[-1] < offsets[warm] + 2.0 and len(offsets) - warm == pytest.approx(20, abs=12)


@pytest.mark.parametrize("bad", [dict(rate=0), dict(rate=-1), dict(rate=math.nan), dict(rate=1, burstiness=0),
                                 dict(rate=1, ramp_up_s=-1)])
def test_bad_schedules_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        schedule.arrival_offsets(3, **bad)
