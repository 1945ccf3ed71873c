"""The SLO box of the frontier and run pages: bounds drawn where the axes show them, attainment per point.

The fixture's levels have one TTFT each (TTFT = 40 + 2c ms: 48, 56, 72, 104 ms at c = 4, 8, 16, 32), so
under ttft_ms=60 every request of c4 and c8 meets it and none of c16 and c32 does."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

import dashboard_fixture as fxdb  # noqa: E402
from test_dashboard_pages import figures, open_page, page_table  # noqa: E402

from k2bench.dashboard import charts  # noqa: E402
from k2bench.harness.measure.slo import parse_slo  # noqa: E402

SLO = "ttft_ms=60,tpot_ms=50"
WANT = {4: 1.0, 8: 1.0, 16: 0.0, 32: 0.0}


@pytest.fixture(scope="module")
def fixture(tmp_path_factory) -> fxdb.Fixture:
    return fxdb.build(f"sqlite:///{tmp_path_factory.mktemp('dash_slo') / 'fixture.db'}")


def test_frontier_draws_the_tpot_floor_and_hovers_attainment(fixture, monkeypatch):
    at = open_page(fixture.url, "Frontier", monkeypatch)
    assert at.text_input(key="frontier_slo").value == ""  # no run was swept under an SLO
    at.text_input(key="frontier_slo").input(SLO).run()
    assert not at.exception
    (fig,) = figures(at)
    # a TPOT bound of 50 ms is a floor of 1000 / 50 = 20 tok/s/user on the interactivity axis
    lines = [s for s in fig["layout"].get("shapes", []) if s.get("x0") == s.get("x1")]
    assert [s["x0"] for s in lines] == [pytest.approx(20.0)]
    (points,) = [t for t in fig["data"] if t["name"].startswith("vllm") and t["mode"] == "markers+text"]
    assert sorted(points["text"]) == sorted(f"c{c}" for c in fxdb.LEVELS)
    for label, hover in zip(points["text"], points["customdata"], strict=True):
        assert f"SLO attainment: {100 * WANT[int(label[1:])]:.1f}%" in hover
    table = page_table(at, "frontier_table")
    got = dict(zip(table[table["config"].str.startswith("vllm")]["concurrency"],
                   table[table["config"].str.startswith("vllm")]["slo_attainment"], strict=True))
    assert got == WANT


def test_frontier_refuses_a_bad_slo_in_words(fixture, monkeypatch):
    at = open_page(fixture.url, "Frontier", monkeypatch)
    at.text_input(key="frontier_slo").input("ttft=60").run()
    assert not at.exception
    assert any("known: ttft_ms" in e.value for e in at.error)
    assert not [s for s in figures(at)[0]["layout"].get("shapes", []) if s.get("x0") == s.get("x1")]


def test_run_page_lists_attainment_per_level(fixture, monkeypatch):
    run_id = fixture.runs[("vllm", 0)]
    monkeypatch.setenv("K2BENCH_DB", fixture.url)
    at = open_page(fixture.url, "Run detail", monkeypatch)
    at.selectbox(key="detail_run").set_value(run_id).run()
    at.text_input(key="detail_slo").input(SLO).run()
    assert not at.exception
    table = page_table(at, "detail_levels")
    assert dict(zip(table["concurrency"], table["slo_attainment"], strict=True)) == WANT


@pytest.mark.parametrize("view, bound, axis, value", [
    ("Throughput vs E2E latency", "e2el_ms=300", "x", 300.0),
    ("TTFT vs throughput", "ttft_ms=60", "y", 60.0),
    ("Cost vs interactivity", "tpot_ms=25", "x", 40.0),
    ("Throughput vs interactivity", "ttft_ms=60,e2el_ms=300", None, None),  # neither axis shows them
])
def test_bounds_land_on_the_axis_that_shows_them(view, bound, axis, value):
    got = charts.slo_bounds(charts.VIEWS[view], parse_slo(bound))
    assert [(a, v) for a, v, _ in got] == ([] if axis is None else [(axis, value)])
