"""Pareto frontiers of throughput per GPU against interactivity, and how far one moved.

A sweep gives one point per concurrency: x = interactivity (tok/s/user), y = tok/s/GPU. Both are
better when higher, so the frontier is the set of points no other point beats on both axes; drawn
with interactivity on the x axis it is the upper-right envelope, falling from high throughput at low
interactivity (large batches) to low throughput at high interactivity.

"Did the curve move?" is answered at *matched interactivity*: each sweep's attainable frontier is
evaluated at the same interactivity values over the range both sweeps cover, and the throughputs are
compared there. The attainable frontier at interactivity x is the best throughput the sweep's curve
reaches at x or above: the curve through every level (sorted by interactivity) is interpolated
piecewise linearly in log-log space (log tok/s/GPU against log tok/s/user), then its running maximum
is taken from the high-interactivity end. Log-log because the concurrency levels are powers of two,
so the points are roughly evenly spaced in log interactivity, and the trade-off is close to a power
law, a straight line in that space. Through every level, not only the Pareto points, because a level
that slips 1% below a neighbour leaves the Pareto set, and interpolating across the gap it leaves
would lift the curve there by far more than 1%: the verdict would hang on that one flip. Built this
way, moving any level by a factor moves the frontier by at most that factor anywhere.

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


def attainable(x, y, xq) -> np.ndarray:
    """Best throughput the sweep reaches at interactivity xq or above; NaN outside its x range.

    Exact for the log-log interpolated curve: its maximum over [xq, max x] lies at xq or at a level.
    """
    xq = np.asarray(xq, dtype=float)
    pts = np.column_stack([np.asarray(x, dtype=float), np.asarray(y, dtype=float)])
    pts = pts[np.all(np.isfinite(pts), axis=1) & np.all(pts > 0, axis=1)]
    if len(pts) == 0:
        return np.full_like(xq, np.nan)
    lx, inverse = np.unique(np.log(pts[:, 0]), return_inverse=True)
    ly = np.full(len(lx), -np.inf)
    np.maximum.at(ly, inverse, np.log(pts[:, 1]))  # levels at one interactivity: the best counts
    lq = np.log(xq)
    on_curve = np.interp(lq, lx, ly)
    best_right = np.maximum.accumulate(ly[::-1])[::-1]  # best level at or above each knot
    first_right = np.searchsorted(lx, lq - 1e-12, side="left")
    out = np.exp(np.maximum(on_curve, best_right[np.minimum(first_right, len(lx) - 1)]))
    outside = (lq < lx[0] - 1e-12) | (lq > lx[-1] + 1e-12)
    out[outside] = np.nan
    return out


@dataclass
class FrontierComparison:
    baseline: list[tuple[float, float]]  # Pareto points (interactivity, tok/s/GPU), for display
    candidate: list[tuple[float, float]]
    overlap: tuple[float, float] | None  # interactivity range both sweeps cover
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
    """Compare two sweeps' attainable frontiers at matched interactivity over the range both cover."""
    fb, fc = frontier(base_x, base_y), frontier(cand_x, cand_y)
    result = FrontierComparison(baseline=[tuple(p) for p in fb.tolist()],
                                candidate=[tuple(p) for p in fc.tolist()], overlap=None)
    if len(fb) == 0 or len(fc) == 0:
        return result
    bx, cx = _usable_x(base_x, base_y), _usable_x(cand_x, cand_y)
    lo, hi = max(bx.min(), cx.min()), min(bx.max(), cx.max())
    if not hi > lo * (1 + 1e-9):
        return result
    result.overlap = (float(lo), float(hi))
    xs = np.exp(np.linspace(math.log(lo), math.log(hi), grid))
    yb, yc = attainable(base_x, base_y, xs), attainable(cand_x, cand_y, xs)
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
            yc_at = float(attainable(cand_x, cand_y, [min(max(x, lo), hi)])[0])
            result.matched.append({"interactivity": float(x), "baseline": float(y), "candidate": yc_at,
                                   "ratio": yc_at / float(y)})
    return result


def _usable_x(x, y) -> np.ndarray:
    """Interactivities of the levels that can be drawn (finite and positive on both axes)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    return x[ok]
