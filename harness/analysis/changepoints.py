"""Change points in a metric's history: E-divisive means with a t-test significance check.

The method follows the idea Apache Otava (formerly Hunter) applies to performance histories;
this is an independent implementation:

1. Candidate split: for a segment x[0:n], every split tau (with at least ``min_size`` points on each
   side) is scored with the energy statistic of Szekely-Rizzo / Matteson-James (alpha = 1)

       Q(tau) = m*k/(m+k) * ( 2/(m*k) * sum|x_i - y_j|
                              - 1/C(m,2) * sum_{i<i'}|x_i - x_i'| - 1/C(k,2) * sum_{j<j'}|y_j - y_j'| )

   with x the m points before tau and y the k points after; the best tau maximises Q. The
   statistic sees any change in distribution, not only in the mean, and makes no normality assumption.
2. Significance: the best split is kept only if Student's two-sample t-test (pooled variance)
   between the two sides gives a two-sided p-value below ``pvalue`` (default 0.001, as Otava). A
   t-test is cheap and deterministic, unlike the permutation test of the original E-divisive paper.
   The pooled variance matters: with Welch's test a 3-point edge segment that happens to be tight
   gives absurd p-values (we measured 5% of pure-noise 60-run series flagged; pooled: under 2%).
   Because the split is the best of many, the nominal p-value is optimistic; the measured rate on
   pure Gaussian noise (60 runs, p 0.001) is about 1.5% of series with any change point.
3. Recursion: accepted splits divide the segment and both halves are searched again (binary
   segmentation).
4. Windows: the series is cut into overlapping windows of ``window`` points (default 50, step
   window/2), so an old shift does not hide a new one and the cost stays bounded on long histories.
   Candidates found in different windows that lie within ``min_size`` of each other are merged.
5. Pruning: each surviving change point is re-tested against its neighbours (the points between the
   previous and the next change point, at most ``window`` on each side); the weakest one that fails
   is dropped and the rest re-tested, until all pass.

The index of a change point is the first run of the new regime, so its commit is the suspect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from k2bench.harness.measure.catalogue import GATE_METRICS, over_trials

DEFAULT_WINDOW = 50
DEFAULT_PVALUE = 0.001
DEFAULT_MIN_SIZE = 3


@dataclass(frozen=True)
class ChangePoint:
    index: int  # first index of the new regime
    p_value: float
    mean_before: float
    mean_after: float

    @property
    def rel_change(self) -> float:
        return (self.mean_after - self.mean_before) / abs(self.mean_before) if self.mean_before else math.nan


def energy_split(x: np.ndarray, min_size: int = DEFAULT_MIN_SIZE) -> tuple[int, float] | None:
    """Best split (tau, Q) of a segment by the energy statistic, or None if it is too short."""
    n = len(x)
    min_size = max(min_size, 2)
    if n < 2 * min_size:
        return None
    d = np.abs(x[:, None] - x[None, :])
    # Prefix sums over the distance matrix give every block sum in O(1).
    s = np.zeros((n + 1, n + 1))
    s[1:, 1:] = d.cumsum(0).cumsum(1)

    def block(r0: int, r1: int, c0: int, c1: int) -> float:
        return s[r1, c1] - s[r0, c1] - s[r1, c0] + s[r0, c0]

    best_tau, best_q = -1, -math.inf
    for tau in range(min_size, n - min_size + 1):
        m, k = tau, n - tau
        cross = block(0, m, m, n) / (m * k)
        within_x = block(0, m, 0, m) / (m * (m - 1))  # full block counts each pair twice
        within_y = block(m, n, m, n) / (k * (k - 1))
        q = m * k / (m + k) * (2 * cross - within_x - within_y)
        if q > best_q:
            best_tau, best_q = tau, q
    return best_tau, best_q


def ttest_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided pooled-variance t-test p-value; 1.0 when it cannot be computed, 0 for a clean step without noise."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return 1.0
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return 0.0 if a[0] != b[0] else 1.0
    p = stats.ttest_ind(a, b, equal_var=True).pvalue
    return float(p) if math.isfinite(p) else 1.0


def _segment(x: np.ndarray, lo: int, hi: int, pvalue: float, min_size: int, found: dict[int, float]) -> None:
    split = energy_split(x[lo:hi], min_size)
    if split is None:
        return
    tau = lo + split[0]
    p = ttest_p(x[lo:tau], x[tau:hi])
    if p >= pvalue:
        return
    found[tau] = min(p, found.get(tau, 1.0))
    _segment(x, lo, tau, pvalue, min_size, found)
    _segment(x, tau, hi, pvalue, min_size, found)


def detect(values, window: int = DEFAULT_WINDOW, pvalue: float = DEFAULT_PVALUE,
           min_size: int = DEFAULT_MIN_SIZE) -> list[ChangePoint]:
    """Change points of a series ordered oldest first (NaNs are not allowed; drop them first)."""
    x = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(x)):
        raise ValueError("detect() needs finite values; drop missing runs first")
    if window < 2 * min_size:
        raise ValueError(f"window {window} is too small for min_size {min_size}")
    n = len(x)
    found: dict[int, float] = {}
    step = max(window // 2, 1)
    starts = list(range(0, max(n - window, 0) + 1, step))
    if starts and starts[-1] + window < n:
        starts.append(n - window)
    for lo in starts or [0]:
        _segment(x, lo, min(lo + window, n), pvalue, min_size, found)
    points = _merge_close(found, min_size)
    points = _prune(x, points, window, pvalue)
    out = []
    for i, tau in enumerate(points):
        left = points[i - 1] if i else 0
        right = points[i + 1] if i + 1 < len(points) else n
        before, after = x[max(left, tau - window):tau], x[tau:min(right, tau + window)]
        out.append(ChangePoint(index=tau, p_value=ttest_p(before, after), mean_before=float(before.mean()),
                               mean_after=float(after.mean())))
    return out


def _merge_close(found: dict[int, float], min_size: int) -> list[int]:
    kept: list[int] = []
    for tau in sorted(found, key=lambda t: (found[t], t)):  # strongest first
        if all(abs(tau - k) >= min_size for k in kept):
            kept.append(tau)
    return sorted(kept)


def _prune(x: np.ndarray, points: list[int], window: int, pvalue: float) -> list[int]:
    points = list(points)
    while points:
        ps = []
        for i, tau in enumerate(points):
            left = points[i - 1] if i else 0
            right = points[i + 1] if i + 1 < len(points) else len(x)
            ps.append(ttest_p(x[max(left, tau - window):tau], x[tau:min(right, tau + window)]))
        worst = int(np.argmax(ps))
        if ps[worst] < pvalue:
            break
        points.pop(worst)
    return points


def default_metrics() -> tuple[str, ...]:
    """The metrics scanned when none are named: the ones the regression gate judges."""
    return tuple(m.column for m in GATE_METRICS)


def without_values(points, names) -> list[str]:
    """The metrics of ``names`` that no counted level of a points_frame-shaped history has a value of."""
    if "valid" in points.columns:
        points = points[points["valid"].fillna(False).astype(bool)]
    return [n for n in names if n not in points.columns or points[n].isna().all()]


def history_change_points(points, metrics: tuple[str, ...] | None = None, window: int = DEFAULT_WINDOW,
                          pvalue: float = DEFAULT_PVALUE, min_size: int = DEFAULT_MIN_SIZE) -> list[dict]:
    """Change points of every metric and level (kind and concurrency) in a points_frame-shaped history.

    One value per run (its trials reduced by catalogue.over_trials, the median), runs ordered by start time. Rows match
    ``Store.replace_change_points``: metric, mode, rate, concurrency, run_id, commit, detected_at, mean_before,
    mean_after, rel_change, p_value.
    """
    from datetime import datetime, timezone

    if metrics:
        unknown = [c for c in metrics if c not in points.columns]
        if unknown:
            raise ValueError(f"no metric column {', '.join(map(repr, unknown))} in the history "
                             f"(e.g. {', '.join(default_metrics())})")
    cols = [c for c in (metrics or default_metrics()) if c in points.columns]
    if "valid" in points.columns:  # invalid levels are kept in the store but never scanned
        points = points[points["valid"].fillna(False).astype(bool)]
    if len(points) == 0 or not cols:
        return []
    points = points.copy()  # a level's kind: (mode, rate); a rate of -1 stands for "none" (closed) while grouping
    points["mode"] = points["mode"].fillna("closed") if "mode" in points.columns else "closed"
    points["rate"] = points["rate"].fillna(-1.0) if "rate" in points.columns else -1.0
    keys = ["run_id", "mode", "rate", "concurrency"]
    meta = points.groupby(keys, as_index=False)[["started_at", "commit"]].first()
    runs = over_trials(points, cols, keys).merge(meta, on=keys).sort_values(["started_at", "run_id"])
    now = datetime.now(timezone.utc)
    rows = []
    for (mode, rate, conc), g in runs.groupby(["mode", "rate", "concurrency"]):
        for col in cols:
            series = g[["run_id", "commit", col]].dropna()
            for cp in detect(series[col].to_numpy(float), window, pvalue, min_size):
                at = series.iloc[cp.index]
                rows.append({"metric": col, "mode": mode, "rate": None if rate < 0 else float(rate),
                             "concurrency": int(conc), "run_id": int(at["run_id"]),
                             "commit": at["commit"], "detected_at": now, "mean_before": cp.mean_before,
                             "mean_after": cp.mean_after, "rel_change": cp.rel_change, "p_value": cp.p_value})
    return rows
