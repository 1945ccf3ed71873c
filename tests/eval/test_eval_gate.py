"""The accuracy gate on per-item scores: thresholds per model and a two-proportion test."""

from __future__ import annotations

import pytest
from scipy.stats import fisher_exact

from k2bench.errors import UserError
from k2bench.harness.eval.gate import judge, load_thresholds, threshold_for, two_proportion_p


def items(right: int, n: int) -> list[float]:
    return [1.0] * right + [0.0] * (n - right)


def test_drop_from_097_to_080_at_n500_fails_and_097_to_096_passes():
    base = items(485, 500)  # 0.97
    big = judge("tiny-arith", "m", items(400, 500), base)  # 0.80
    assert big.failed and "accuracy 0.800 is below the tiny-arith threshold 0.95" in big.reason
    assert big.p_value < 1e-6
    small = judge("tiny-arith", "m", items(480, 500), base)  # 0.96
    assert not small.failed and small.status == "ok" and small.p_value > 0.05


def test_significant_drop_above_threshold_still_fails():
    thresholds = {"t": {"default": 0.5}}
    v = judge("t", "m", items(400, 500), items(485, 500), thresholds=thresholds)
    assert v.failed and v.reason.startswith("accuracy dropped 0.970 -> 0.800")


def test_threshold_alone_without_baseline_and_per_model_override():
    thresholds = {"t": {"default": 0.9, "models": {"small": 0.5}}}
    assert judge("t", "big", items(80, 100), None, thresholds=thresholds).failed
    assert not judge("t", "small", items(80, 100), None, thresholds=thresholds).failed
    assert threshold_for("other", "m", thresholds) is None


def test_improvement_is_named_not_failed():
    v = judge("t", "m", items(490, 500), items(400, 500), thresholds={})
    assert v.status == "improvement" and not v.failed


def test_p_value_agrees_with_an_independent_exact_test():
    """The z-test's one-sided p is close to Fisher's exact test on the same 2x2 table at this n."""
    for b, c in [(485, 400), (485, 470), (485, 480)]:
        z = two_proportion_p(b, 500, c, 500)
        exact = fisher_exact([[b, 500 - b], [c, 500 - c]], alternative="greater").pvalue
        assert (z < 0.05) == (exact < 0.05)
        assert z == pytest.approx(exact, abs=0.06)


def test_shipped_thresholds_and_bad_scores():
    shipped = load_thresholds()
    assert threshold_for("tiny-arith", "any", shipped) == 0.95 and threshold_for("gsm8k", "x", shipped) == 0.90
    with pytest.raises(UserError, match="0 or 1"):
        judge("t", "m", [0.5, 1.0], None, thresholds={})
