"""The accuracy gate: a per-model threshold, and a one-sided two-proportion test against the baseline.

A candidate fails when its accuracy is below the task's threshold for its model, or when it is lower
than the baseline's by at least `min_drop` and the drop is significant: the pooled two-proportion
z-test gives p < `alpha`. Both are needed for the second rule, as for speed: a tiny real drop is noise
at any n, and a big drop on few items is not evidence yet.

The test needs only each side's proportion and item count, so an evaluation stored without per-item
scores (an imported result that kept value, stderr and n) is judged as well: its right answers are
value x n. Where per-item scores are kept they give the count exactly (`counts_of`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from scipy.stats import norm

from k2bench.errors import UserError

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

THRESHOLDS_FILE = Path(__file__).with_name("thresholds.toml")


@dataclass(frozen=True)
class AccuracyVerdict:
    task: str
    model: str
    baseline: float | None
    candidate: float
    n_baseline: int
    n_candidate: int
    threshold: float | None
    p_value: float | None
    status: str  # "ok", "regression" or "improvement"
    reason: str

    @property
    def failed(self) -> bool:
        return self.status == "regression"


def load_thresholds(path: str | Path = THRESHOLDS_FILE) -> dict:
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read accuracy thresholds {path}: {exc}") from exc


def threshold_for(task: str, model: str, thresholds: dict) -> float | None:
    entry = thresholds.get(task) or {}
    models = entry.get("models") or {}
    value = models.get(model, entry.get("default"))
    return None if value is None else float(value)


def two_proportion_p(right_a: int, n_a: int, right_b: int, n_b: int) -> float:
    """One-sided p-value that proportion b is below proportion a (pooled z-test)."""
    pooled = (right_a + right_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    diff = right_a / n_a - right_b / n_b
    if se == 0:
        return 0.0 if diff > 0 else 1.0
    return float(norm.sf(diff / se))


def _counts(items: list[float]) -> tuple[int, int]:
    if any(x not in (0, 1) for x in items):
        raise UserError("per-item accuracy scores must be 0 or 1 for the two-proportion test")
    return int(sum(items)), len(items)


def counts_of(evals: list[dict]) -> tuple[int, int] | None:
    """(right answers, items) pooled over evaluations of one task: counted from the per-item scores where
    an evaluation kept them, else value x n (the value is a proportion of n items, so this is exact up to
    the rounding of a stored float). None when there is nothing to count."""
    right = n = 0
    for ev in evals:
        if ev.get("items"):
            r, k = _counts(ev["items"])
        else:
            if ev.get("value") is None or not ev.get("n"):
                continue
            r, k = round(float(ev["value"]) * int(ev["n"])), int(ev["n"])
        right, n = right + r, n + k
    return (right, n) if n else None


def judge(task: str, model: str, candidate: list[float], baseline: list[float] | None, *,
          thresholds: dict | None = None, alpha: float = 0.05, min_drop: float = 0.01) -> AccuracyVerdict:
    """The verdict on a candidate's per-item scores against the baseline's (None: threshold only)."""
    if not candidate:
        raise UserError(f"{task}: the candidate run has no per-item scores")
    return judge_counts(task, model, _counts(candidate), _counts(baseline) if baseline else None,
                        thresholds=thresholds, alpha=alpha, min_drop=min_drop)


def judge_counts(task: str, model: str, candidate: tuple[int, int], baseline: tuple[int, int] | None, *,
                 thresholds: dict | None = None, alpha: float = 0.05, min_drop: float = 0.01) -> AccuracyVerdict:
    """The verdict on a candidate's (right, n) against the baseline's (None: threshold only)."""
    c_right, c_n = candidate
    if c_n <= 0:
        raise UserError(f"{task}: the candidate evaluation has no items")
    thr = threshold_for(task, model, load_thresholds() if thresholds is None else thresholds)
    c_val = c_right / c_n
    base_val = p = None
    b_n = 0
    status, reason = "ok", "within threshold"
    if baseline and baseline[1] > 0:
        b_right, b_n = baseline
        base_val = b_right / b_n
        p = two_proportion_p(b_right, b_n, c_right, c_n)
        if base_val - c_val >= min_drop and p < alpha:
            status, reason = "regression", f"accuracy dropped {base_val:.3f} -> {c_val:.3f} (p={p:.2g}, n={c_n})"
        elif c_val - base_val >= min_drop and two_proportion_p(c_right, c_n, b_right, b_n) < alpha:
            status, reason = "improvement", f"accuracy rose {base_val:.3f} -> {c_val:.3f}"
        else:
            reason = f"{base_val:.3f} -> {c_val:.3f} is not a significant drop (p={p:.2g})"
    if thr is not None and c_val < thr:
        status, reason = "regression", f"accuracy {c_val:.3f} is below the {task} threshold {thr:.2f} for {model}"
    return AccuracyVerdict(task, model, base_val, c_val, b_n, c_n, thr, p, status, reason)
