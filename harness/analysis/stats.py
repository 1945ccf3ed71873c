"""Small statistics used by the regression gate.

Two independent questions decide whether a change is real:

* Is it large?  ``effect(...)`` gives the signed relative change and how much *worse* it is,
  taking the metric's direction into account (higher is better for throughput and interactivity,
  lower is better for latencies).
* Is it more than noise?  ``noise_test(...)`` compares the candidate against the spread of the
  baseline history (runs screened for outliers by median/MAD, then a Student-t prediction test); ``mann_whitney(...)`` compares two samples
  (repeated trials, or per-request values) without assuming a distribution.

Both tests are one-sided in the direction of the observed change, so they answer "is it this much
worse (or better) than chance would give".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# MAD of a normal sample times this constant estimates its standard deviation.
MAD_TO_SIGMA = 1.4826
# Relative floor for the robust spread: a history of identical numbers (a deterministic server, a
# fixture) must not make every 0.1% wiggle "significant".
MIN_REL_SIGMA = 0.002


@dataclass(frozen=True)
class Spread:
    center: float  # median
    sigma: float  # 1.4826 * MAD, floored at MIN_REL_SIGMA * |median|
    n: int

    @property
    def cv(self) -> float:
        return self.sigma / abs(self.center) if self.center else math.inf


def robust_spread(values, min_sigma: float = 0.0) -> Spread:
    """Median and MAD-based sigma of a history; one outlier run does not widen it much.

    sigma is floored at MIN_REL_SIGMA * |median| and at ``min_sigma`` (for values centred on zero)."""
    arr = _finite(values)
    if arr.size == 0:
        raise ValueError("robust_spread needs at least one finite value")
    center = float(np.median(arr))
    sigma = MAD_TO_SIGMA * float(np.median(np.abs(arr - center)))
    return Spread(center=center, sigma=max(sigma, MIN_REL_SIGMA * abs(center), min_sigma), n=int(arr.size))


@dataclass(frozen=True)
class Effect:
    rel_change: float  # (candidate - baseline) / baseline, signed as measured
    worse_by: float  # > 0 when the candidate is worse, in relative terms, direction-aware


def effect(baseline: float, candidate: float, higher_is_better: bool) -> Effect:
    """Relative change and its direction-aware 'worse by' amount."""
    if baseline == 0 or not math.isfinite(baseline) or not math.isfinite(candidate):
        return Effect(math.nan, math.nan)
    rel = (candidate - baseline) / abs(baseline)
    return Effect(rel_change=rel, worse_by=-rel if higher_is_better else rel)


def effect_factor(baseline: float, candidate: float, higher_is_better: bool) -> float:
    """asv-style factor: > 1 means worse by that factor (e.g. 1.10 = 10% worse)."""
    if baseline <= 0 or candidate <= 0:
        return math.nan
    return baseline / candidate if higher_is_better else candidate / baseline


@dataclass(frozen=True)
class NoiseTest:
    z: float  # (candidate - baseline center) / standard error of that difference
    p_value: float  # one-sided, in the direction of the observed change
    sigma: float
    n_history: int


# Runs farther than this many MAD-sigmas from the median are dropped from a history before its
# spread is taken (a throttled or broken run would otherwise blind the gate), but only when the
# history holds at least SCREEN_MIN_RUNS runs: with fewer, the MAD itself is too unstable and the
# screen throws away honest runs (measured: 5 MADs on 5 runs raised the false-positive rate at 3% CV
# from 0.7% to 1.2%; 5 MADs on 10 runs from 0.8% to 1.0%; 6 MADs from 10 runs up costs ~0.05%).
SCREEN_MADS = 6.0
SCREEN_MIN_RUNS = 10


def screened(values) -> np.ndarray:
    """Finite values without outlying runs (median/MAD screen; see SCREEN_MADS)."""
    arr = _finite(values)
    if arr.size < SCREEN_MIN_RUNS:
        return arr
    spread = robust_spread(arr)
    return arr[np.abs(arr - spread.center) <= SCREEN_MADS * spread.sigma]


def center(values) -> float:
    """Mean of the screened values: the baseline or candidate level used in comparisons."""
    arr = screened(values)
    return float(arr.mean()) if arr.size else math.nan


def noise_test(history, baseline_center: float, candidate: float, *, n_baseline: int = 1,
               n_candidate: int = 1, min_sigma: float = 0.0) -> NoiseTest:
    """How unusual is the candidate given the run-to-run spread of the baseline history?

    A Student-t prediction test: the spread is the standard deviation of the screened history (see
    ``screened``), floored at MIN_REL_SIGMA of its mean and at ``min_sigma``; the standard error of
    the difference counts both sides (means of ``n_candidate`` and ``n_baseline`` runs); the p-value
    is one-sided with n-1 degrees of freedom because the spread is estimated from few runs.
    The median/MAD spread was measured as the scale too: with 5 runs its instability let 2% of
    pure-noise comparisons through at 3% CV (alpha 0.01), against 0.7% for this test.
    """
    from scipy import stats

    hist = screened(history)
    if hist.size < 2:
        raise ValueError("noise_test needs at least two history values")
    sd = float(hist.std(ddof=1))
    sigma = max(sd, MIN_REL_SIGMA * abs(float(hist.mean())), min_sigma)
    se = sigma * math.sqrt(1.0 / max(n_candidate, 1) + 1.0 / max(n_baseline, 1))
    z = (candidate - baseline_center) / se
    p = float(stats.t.sf(abs(z), hist.size - 1))
    return NoiseTest(z=float(z), p_value=p, sigma=sigma, n_history=int(hist.size))


@dataclass(frozen=True)
class RankTest:
    u: float
    p_value: float  # one-sided, in the direction of the observed change
    n_baseline: int
    n_candidate: int


def min_mann_whitney_p(n1: int, n2: int) -> float:
    """Smallest one-sided p-value an exact Mann-Whitney test can give for these sizes."""
    return 1.0 / math.comb(n1 + n2, n1)


def mann_whitney(baseline, candidate, alternative: str | None = None) -> RankTest | None:
    """One-sided Mann-Whitney U test; None if too few samples.

    ``alternative`` is "greater" (candidate tends higher) or "less"; by default the direction of the
    median shift.

    Exact p-values for small samples, the normal approximation with tie correction otherwise
    (scipy chooses). Rank-based, so any monotone transform of the metric gives the same answer.
    """
    from scipy import stats

    a, b = _finite(baseline), _finite(candidate)
    if a.size < 2 or b.size < 2:
        return None
    if np.all(a == a[0]) and np.all(b == a[0]):
        return RankTest(u=float(a.size * b.size) / 2, p_value=1.0, n_baseline=a.size, n_candidate=b.size)
    if alternative is None:
        alternative = "greater" if np.median(b) >= np.median(a) else "less"
    res = stats.mannwhitneyu(b, a, alternative=alternative)
    return RankTest(u=float(res.statistic), p_value=float(res.pvalue), n_baseline=int(a.size),
                    n_candidate=int(b.size))


def _finite(values) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]
