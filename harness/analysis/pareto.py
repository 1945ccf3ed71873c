"""Pareto frontiers of throughput per GPU against interactivity, and how far one moved.

A sweep gives one point per concurrency: x = interactivity (tok/s/user), y = tok/s/GPU. Both are
better when higher, so the frontier is the set of points no other point beats on both axes; drawn
with interactivity on the x axis it is the upper-right envelope, falling from high throughput at low
interactivity (large batches) to low throughput at high interactivity.

"Did the curve move?" is answered at *matched interactivity*: both frontiers are interpolated at
the same interactivity values over the range both cover, and their throughputs are compared there.
Interpolation is piecewise linear in log-log space (log tok/s/GPU against log tok/s/user): the
concurrency levels are powers of two, so the points are roughly evenly spaced in log interactivity,
and the trade-off is close to a power law, which is a straight line in that space. Linear
interpolation in raw units would bend the curve between sparse points and bias ratios upward.

The summary is the geometric mean throughput ratio over the overlap (evenly weighted in log
interactivity), which equals exp(area between the log frontiers / width of the overlap). The absolute
area between the frontiers, in tok/s/GPU x ln(tok/s/user), is reported as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def frontier(x, y) -> np.ndarray:
    """Non-dominated points as an (k, 2) array sorted by increasing x (then decreasing y)."""
    pts = np.column_stack([np.asarray(x, dtype=float), np.asarray(y, dtype=float)])
    pts = pts[np.all(np.isfinite(pts), axis=1) & np.all(pts > 0, axis=1)]
    if len(pts) == 0:
        return pts.reshape(0, 2)
    # Walk from the highest interactivity down; a point joins when it beats every point to its right on y.
    order = np.lexsort((-pts[:, 1], -pts[:, 0]))
    kept, best_y = [], -math.inf
    for i in order:
        if pts[i, 1] > best_y:
            kept.append(pts[i])
            best_y = pts[i, 1]
    return np.array(kept[::-1])


def interpolate(front: np.ndarray, xq) -> np.ndarray:
    """Throughput on the frontier at interactivity xq (log-log linear); NaN outside its x range."""
    xq = np.asarray(xq, dtype=float)
    if len(front) == 0:
        return np.full_like(xq, np.nan)
    lx, ly = np.log(front[:, 0]), np.log(front[:, 1])
    out = np.exp(np.interp(np.log(xq), lx, ly))
    outside = (xq < front[0, 0] * (1 - 1e-12)) | (xq > front[-1, 0] * (1 + 1e-12))
    out[outside] = np.nan
    return out


@dataclass
class FrontierComparison:
    baseline: list[tuple[float, float]]  # frontier points (interactivity, tok/s/GPU)
    candidate: list[tuple[float, float]]
    overlap: tuple[float, float] | None  # interactivity range both frontiers cover
    geo_mean_ratio: float = math.nan  # candidate / baseline throughput, geometric mean over the overlap
    min_ratio: float = math.nan
    min_ratio_at: float = math.nan  # interactivity where the candidate is relatively worst
    max_ratio: float = math.nan
    area_between: float = math.nan  # integral of (cand - base) tok/s/GPU over ln(interactivity)
    matched: list[dict] = field(default_factory=list)  # at each baseline frontier x inside the overlap

    @property
    def shift(self) -> float:
        """Relative throughput change at matched interactivity (geometric mean); -0.08 = 8% lower."""
        return self.geo_mean_ratio - 1.0


def compare_frontiers(base_x, base_y, cand_x, cand_y, grid: int = 129) -> FrontierComparison:
    """Compare two sweeps' frontiers at matched interactivity over the range both cover."""
    fb, fc = frontier(base_x, base_y), frontier(cand_x, cand_y)
    result = FrontierComparison(baseline=[tuple(p) for p in fb.tolist()],
                                candidate=[tuple(p) for p in fc.tolist()], overlap=None)
    if len(fb) < 2 or len(fc) < 2:
        return result
    lo, hi = max(fb[0, 0], fc[0, 0]), min(fb[-1, 0], fc[-1, 0])
    if not hi > lo * (1 + 1e-9):
        return result
    result.overlap = (float(lo), float(hi))
    xs = np.exp(np.linspace(math.log(lo), math.log(hi), grid))
    yb, yc = interpolate(fb, xs), interpolate(fc, xs)
    log_ratio = np.log(yc / yb)
    width = math.log(hi) - math.log(lo)
    lnx = np.log(xs)
    result.geo_mean_ratio = float(math.exp(np.trapezoid(log_ratio, lnx) / width))
    i = int(np.argmin(log_ratio))
    result.min_ratio, result.min_ratio_at = float(math.exp(log_ratio[i])), float(xs[i])
    result.max_ratio = float(math.exp(log_ratio.max()))
    result.area_between = float(np.trapezoid(yc - yb, lnx))
    for x, y in fb:
        if lo * (1 - 1e-9) <= x <= hi * (1 + 1e-9):
            yc_at = float(interpolate(fc, [min(max(x, lo), hi)])[0])
            result.matched.append({"interactivity": float(x), "baseline": float(y), "candidate": yc_at,
                                   "ratio": yc_at / float(y)})
    return result
