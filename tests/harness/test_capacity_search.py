"""The capacity search's bracketing and bisection on a known boundary (no server), and its settings."""

from __future__ import annotations

import pytest

from k2bench.errors import UserError
from k2bench.harness.measure.slo import parse_slo
from k2bench.harness.run.capacity import Probe, Search, SearchSettings, result_of

SLO = parse_slo("tpot_ms=50")


def probe(load: float, meets: bool) -> Probe:
    n = 40
    met = n if meets else 0
    return Probe(load=load, met=met, n=n, attainment=met / n, low=0.9 if meets else 0.0,
                 high=1.0 if meets else 0.1, goodput_per_gpu=10.0 * load if meets else 0.0, goodput_rps=1.0,
                 valid=True, meets=meets)


def search_against(boundary: int, **kw) -> tuple[Search, list[int]]:
    """Run the search on a server that meets the SLO up to ``boundary`` requests in flight."""
    s = Search(SearchSettings(slo=SLO, **kw))
    loads = []
    while (load := s.next_load()) is not None:
        loads.append(load)
        s.record(probe(load, load <= boundary))
    return s, loads


def test_doubling_then_bisection_finds_the_boundary_in_eight_probes() -> None:
    s, loads = search_against(20)
    assert loads == [4, 8, 16, 32, 24, 20, 22]  # bracket [16, 32), then bisect to [20, 22)
    result = result_of(s, s.settings, stopped=False)
    assert result.capacity == 20 and result.status == "bracketed"
    assert result.above["load"] == 22 and result.goodput_per_gpu == 200.0


@pytest.mark.parametrize("boundary", [3, 5, 9, 13, 20, 37, 50, 64, 100])
def test_every_boundary_within_the_tolerance_or_exactly(boundary: int) -> None:
    s, loads = search_against(boundary, max_probes=10)
    assert s.lo is not None and s.hi is not None
    assert s.lo.load <= boundary < s.hi.load
    assert s.hi.load - s.lo.load <= 1 or s.hi.load <= s.lo.load * 1.1
    assert len(set(loads)) == len(loads)  # never the same load twice


def test_first_probe_misses_halves_down() -> None:
    s, loads = search_against(1)
    assert loads == [4, 2, 1] and s.lo.load == 1 and s.hi.load == 2


def test_nothing_meets_is_no_capacity() -> None:
    s, loads = search_against(0)
    assert loads == [4, 2, 1]
    result = result_of(s, s.settings, stopped=False)
    assert result.capacity is None and result.status == "below-lowest"


def test_probes_spent_before_a_miss_is_a_lower_bound() -> None:
    s, loads = search_against(10_000, max_probes=4)
    assert loads == [4, 8, 16, 32]
    result = result_of(s, s.settings, stopped=False)
    assert result.capacity == 32 and result.status == "lower-bound" and result.above is None


def test_probes_spent_inside_the_bracket_keep_the_best_known() -> None:
    s, loads = search_against(20, max_probes=5)
    assert loads == [4, 8, 16, 32, 24]
    assert s.lo.load == 16 and s.hi.load == 24


@pytest.mark.parametrize(("kw", "message"), [
    ({"target": 1.5}, "--target must be a fraction"),
    ({"target": 0}, "--target must be a fraction"),
    ({"max_probes": 1}, "--max-probes must be at least 2"),
    ({"start": 0}, "--start must be a whole concurrency"),
    ({"start": 2.5}, "--start must be a whole concurrency"),
    ({"tolerance": 0}, "--tolerance must be a fraction"),
    ({"by": "tokens"}, "--by must be one of"),
])
def test_bad_settings_are_clear_errors(kw: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        SearchSettings(slo=SLO, **kw).validate()


def test_capacity_takes_the_sweeps_settings_less_what_the_search_decides() -> None:
    import argparse

    from k2bench.harness.cli import build_parser
    from k2bench.harness.plan import settings

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {s for a in sub.choices["capacity"]._actions for s in a.option_strings}
    for s in settings.SETTINGS:
        expected = settings.SWEEP in s.commands and s.name not in settings.NOT_IN_CAPACITY
        assert (s.flag in flags) == expected, s.flag
    assert {"--conc", "--trials"}.isdisjoint(flags) and {"--slo", "--url", "--isl", "--by", "--target"} <= flags


def test_a_rate_search_bisects_in_requests_per_second() -> None:
    s, loads = search_against_rate(22.9, start=4.0)
    assert loads == [4.0, 8.0, 16.0, 32.0, 24.0, 20.0, 22.0]
    assert s.lo.load == 22.0 and s.hi.load == 24.0  # 24 <= 22 x 1.1: within the tolerance


def test_a_rate_search_halves_below_its_start() -> None:
    s, loads = search_against_rate(0.3)
    assert loads[:3] == [1.0, 0.5, 0.25]  # then bisects [0.25, 0.5)
    assert s.lo.load <= 0.3 < s.hi.load <= s.lo.load * 1.1


def search_against_rate(boundary: float, **kw) -> tuple[Search, list[float]]:
    s = Search(SearchSettings(slo=SLO, by="rate", **kw))
    loads = []
    while (load := s.next_load()) is not None:
        loads.append(load)
        s.record(probe(load, load <= boundary))
    return s, loads
