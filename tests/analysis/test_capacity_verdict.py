"""Capacity between two stored searches: a drop counts only when large and shown by a probe."""

from __future__ import annotations

from k2bench.harness.analysis.capacity import judge


def probe(load: float, met: int, n: int = 40, high: float | None = None, valid: bool = True) -> dict:
    att = met / n
    return {"load": load, "met": met, "n": n, "attainment": att, "low": None, "high": high if high is not None else att,
            "meets": valid and att >= 0.99, "valid": valid}


def search(capacity: float | None, *probes: dict, slo: str = "tpot_ms=43") -> dict:
    return {"by": "concurrency", "slo": slo, "target": 0.99, "tolerance": 0.1, "capacity": capacity,
            "probes": list(probes)}


BASE = search(20, probe(16, 40, high=1.0), probe(20, 40, high=1.0), probe(22, 0, high=0.09))


def test_a_drop_shown_by_a_probe_that_surely_missed_is_a_regression() -> None:
    cand = search(15, probe(15, 40, high=1.0), probe(16, 0, high=0.09))
    v = judge(cand, BASE, threshold=0.05)
    assert v.status == "regression" and round(v.rel_change, 3) == -0.25
    assert v.evidence.startswith("the candidate missed at 16")


def test_a_drop_whose_missing_probe_might_have_met_the_target_is_unconfirmed() -> None:
    # 38 of 40 met: the interval reaches above 99%, so the miss is not shown
    cand = search(15, probe(15, 40, high=1.0), probe(16, 38, high=0.997))
    assert judge(cand, BASE, threshold=0.05).status == "unconfirmed"


def test_a_change_within_the_search_tolerance_is_unchanged_whatever_the_threshold() -> None:
    cand = search(19, probe(19, 40, high=1.0), probe(20, 0, high=0.09))
    v = judge(cand, BASE, threshold=0.01)
    assert v.status == "unchanged" and v.threshold == 0.1


def test_an_improvement_needs_the_baseline_to_have_missed_below_the_new_capacity() -> None:
    cand = search(32, probe(32, 40, high=1.0), probe(36, 0, high=0.09))
    v = judge(cand, BASE, threshold=0.05)
    assert v.status == "improvement" and "the baseline missed at 22" in v.evidence


def test_different_searches_are_not_compared() -> None:
    cand = search(15, probe(16, 0, high=0.09), slo="tpot_ms=50")
    assert judge(cand, BASE, threshold=0.05).status == "missing"
