"""Statistics and frontier maths against independent references (hand values, brute force, closed forms)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from k2bench.harness.analysis import pareto, stats


def test_robust_spread_matches_hand_values_and_ignores_one_outlier():
    s = stats.robust_spread([10, 11, 9, 10, 10, 50])
    # median 10; |dev| = 0,1,1,0,0,40 -> MAD 0.5 -> sigma 0.7413
    assert s.center == 10
    assert s.sigma == pytest.approx(1.4826 * 0.5)
    assert stats.robust_spread([5, 5, 5]).sigma == pytest.approx(5 * stats.MIN_REL_SIGMA)


def test_effect_is_direction_aware():
    thr = stats.effect(100, 90, higher_is_better=True)
    lat = stats.effect(100, 90, higher_is_better=False)
    assert thr.rel_change == pytest.approx(-0.10) and thr.worse_by == pytest.approx(0.10)
    assert lat.worse_by == pytest.approx(-0.10)
    assert stats.effect_factor(100, 80, True) == pytest.approx(1.25)
    assert stats.effect_factor(100, 80, False) == pytest.approx(0.8)


def _exact_mw_p(a, b) -> float:
    """P(U >= u_obs) for 'b tends greater', by enumerating every split of the pooled ranks."""
    pooled = list(a) + list(b)

    def u(bb, aa):
        return sum((x > y) + 0.5 * (x == y) for x in bb for y in aa)

    u_obs = u(b, a)
    splits = list(itertools.combinations(range(len(pooled)), len(b)))
    hits = 0
    for idx in splits:
        bb = [pooled[i] for i in idx]
        aa = [pooled[i] for i in range(len(pooled)) if i not in idx]
        hits += u(bb, aa) >= u_obs - 1e-12
    return hits / len(splits)


def test_mann_whitney_equals_brute_force_permutation_p():
    a, b = [10.0, 11.5, 9.7, 10.2], [12.1, 11.9, 12.5]
    res = stats.mann_whitney(a, b, alternative="greater")
    assert res.p_value == pytest.approx(_exact_mw_p(a, b))
    assert res.p_value == pytest.approx(1 / math.comb(7, 3))
    assert stats.min_mann_whitney_p(4, 3) == pytest.approx(1 / 35)
    assert stats.mann_whitney([1.0], [2.0, 3.0]) is None


def test_noise_test_flags_far_values_only():
    hist = [100, 101, 99, 100.5, 99.5]
    assert stats.noise_test(hist, 100, 90).p_value < 1e-3
    assert stats.noise_test(hist, 100, 99.5).p_value > 0.2


def test_frontier_equals_brute_force_non_dominated_set():
    rng = np.random.default_rng(0)
    x, y = rng.uniform(1, 100, 60), rng.uniform(1, 100, 60)
    front = pareto.frontier(x, y)
    brute = {(xi, yi) for xi, yi in zip(x, y, strict=True)
             if not any((xj >= xi and yj >= yi) and (xj > xi or yj > yi) for xj, yj in zip(x, y, strict=True))}
    assert {tuple(p) for p in front} == brute
    assert np.all(np.diff(front[:, 0]) > 0) and np.all(np.diff(front[:, 1]) < 0)


def test_power_law_shift_is_recovered_exactly_in_log_log():
    # y = 5000 x^-1.2 is a straight line in log-log space: interpolation is exact there.
    bx = np.array([5.0, 10, 20, 40, 80])
    cx = np.array([7.0, 14, 28, 56])
    res = pareto.compare_frontiers(bx, 5000 * bx ** -1.2, cx, 0.9 * 5000 * cx ** -1.2)
    assert res.overlap == (7.0, 56.0)
    assert res.geo_mean_ratio == pytest.approx(0.9, rel=1e-9)
    assert res.min_ratio == pytest.approx(0.9, rel=1e-9)
    # area = integral over ln x of (0.9 - 1) * 5000 x^-1.2 = -0.1 * 5000 * (7^-1.2 - 56^-1.2) / 1.2
    expected = -0.1 * 5000 * (7 ** -1.2 - 56 ** -1.2) / 1.2
    assert res.area_between == pytest.approx(expected, rel=2e-3)
    assert [m["interactivity"] for m in res.matched] == [10, 20, 40]


def test_points_traded_along_one_curve_do_not_move_it():
    def curve(c):
        inter = 60 / (1 + c / 24)
        return inter, c * inter * 9

    b = np.array([curve(c) for c in (4, 8, 16, 32, 64)])
    c = np.array([curve(1.6 * c) for c in (4, 8, 16, 32, 64)])
    res = pareto.compare_frontiers(b[:, 0], b[:, 1], c[:, 0], c[:, 1])
    assert abs(res.shift) < 0.01


def test_no_overlap_gives_no_verdict():
    res = pareto.compare_frontiers([1, 2], [10, 5], [3, 4], [10, 5])
    assert res.overlap is None and math.isnan(res.shift)


def test_noise_test_is_the_student_t_prediction_test():
    hist = np.array([100.0, 102.0, 98.0, 101.0, 99.0])
    nt = stats.noise_test(hist, hist.mean(), 94.0, n_baseline=5)
    se = hist.std(ddof=1) * math.sqrt(1 + 1 / 5)  # independent hand formula
    z = (94.0 - 100.0) / se
    from scipy.stats import t

    assert nt.z == pytest.approx(z)
    assert nt.p_value == pytest.approx(t.cdf(z, df=4))


def test_outlier_runs_are_screened_only_from_long_histories():
    rng = np.random.default_rng(2)
    long = np.r_[100 + rng.normal(0, 1, 11), 60.0]  # one throttled run among 12
    assert 60.0 not in stats.screened(long) and len(stats.screened(long)) == 11
    short = np.array([100.0, 101.0, 99.0, 100.5, 60.0])
    assert len(stats.screened(short)) == 5  # 5 runs: the MAD is too unstable to judge
    # the screened spread is the honest one; unscreened, the throttled run would hide a 10% drop
    assert stats.noise_test(long, 100.0, 90.0, n_baseline=5).p_value < 1e-4


def test_moving_one_level_by_one_percent_moves_the_frontier_by_at_most_one_percent():
    rng = np.random.default_rng(3)
    for _ in range(200):
        x = np.sort(rng.uniform(5, 80, 6))[::-1]
        y = np.cumsum(rng.uniform(-100, 600, 6)) + 1000  # mostly rising with concurrency, with dips
        y2 = y.copy()
        k = rng.integers(6)
        y2[k] *= rng.choice([0.99, 1.01])
        res = pareto.compare_frontiers(x, y, x, y2)
        assert 0.99 - 1e-9 <= res.min_ratio and res.max_ratio <= 1.01 + 1e-9


def test_attainable_frontier_is_the_best_of_the_log_log_curve_at_or_above_each_interactivity():
    x, y = [10.0, 20.0, 40.0], [1000.0, 900.0, 950.0]  # level at 20 is dominated by the one at 40
    at = pareto.attainable(x, y, [10.0, 12.0, 20.0, 30.0, 40.0, 50.0])
    assert at[0] == pytest.approx(1000.0) and at[2] == pytest.approx(950.0) and at[4] == pytest.approx(950.0)
    # at 12 the curve (log-log between 10 and 20) is still above 950: 1000 * 0.9 ** (log 1.2 / log 2)
    assert at[1] == pytest.approx(1000.0 * 0.9 ** (math.log(1.2) / math.log(2)))
    assert at[3] == pytest.approx(950.0) and math.isnan(at[5])
