"""Private stand-in for the Pareto frontier until harness/analysis/pareto.py lands.

Kept tiny on purpose: the dashboard switches to the analysis module's function as soon as it
exists (see k2bench.dashboard.data.pareto_mask), so there is one frontier definition long-term.
"""

from __future__ import annotations

import numpy as np


def non_dominated(x, y, maximize_x: bool = True, maximize_y: bool = True) -> np.ndarray:
    """Boolean mask of the points no other point beats on both axes (ties on both count once)."""
    xs = np.asarray(x, dtype=float) * (1.0 if maximize_x else -1.0)
    ys = np.asarray(y, dtype=float) * (1.0 if maximize_y else -1.0)
    mask = np.zeros(len(xs), dtype=bool)
    valid = ~(np.isnan(xs) | np.isnan(ys))
    idx = np.flatnonzero(valid)
    # best x first; among equal x, best y first, so a later point with the same x never survives
    order = idx[np.lexsort((-ys[idx], -xs[idx]))]
    best_y = -np.inf
    for i in order:
        if ys[i] > best_y:
            mask[i] = True
            best_y = ys[i]
    return mask
