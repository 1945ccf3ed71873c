"""The dashboard carries accuracy: a badge column in the frontier table, a section on the run page."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
sys.path.insert(0, str(Path(__file__).parents[1] / "dashboard"))
import dashboard_fixture as fxdb  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from k2bench.dashboard.data import accuracy_badges, with_accuracy  # noqa: E402
from k2bench.harness.store import Store  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def _ev(value: float, task: str = "tiny-arith") -> dict:
    return {"task": task, "metric": "exact_match", "value": value, "stderr": 0.01, "n": 500, "concurrency": 8,
            "items": None}


def test_badges_mark_each_run_against_its_models_threshold():
    import pandas as pd

    badges = accuracy_badges({1: [_ev(0.968)], 2: [_ev(0.8), _ev(0.5, "gsm8k")], 3: [_ev(0.4, "other")]},
                             {1: "m", 2: "m", 3: "m"})
    assert badges == {1: "✅ tiny-arith 0.968", 2: "❌ tiny-arith 0.800; ❌ gsm8k 0.500", 3: "other 0.400"}
    table = with_accuracy(pd.DataFrame({"run_id": [1, 4]}), badges)
    assert table["accuracy"].tolist() == ["✅ tiny-arith 0.968", ""]


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    fx = fxdb.build(f"sqlite:///{tmp_path_factory.mktemp('dash') / 'fixture.db'}")
    with Store.open(fx.url) as store:
        store.add_eval(fx.runs[("bundled", len(fxdb.COMMITS) - 1)], _ev(0.8))
        store.add_eval(fx.runs[("vllm", len(fxdb.COMMITS) - 1)], _ev(0.97))
    return fx


def _open(url: str, page: str, monkeypatch) -> AppTest:
    monkeypatch.setenv("K2BENCH_DB", url)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["page"] = page
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.slow
def test_frontier_table_shows_each_points_run_accuracy(fixture, monkeypatch):
    at = _open(fixture.url, "Frontier", monkeypatch)
    table = next(d.value for d in at.dataframe if "config" in d.value.columns)
    by_run = dict(zip(table["run_id"], table["accuracy"], strict=True))
    last = len(fxdb.COMMITS) - 1
    assert by_run[fixture.runs[("bundled", last)]] == "❌ tiny-arith 0.800"
    assert by_run[fixture.runs[("vllm", last)]] == "✅ tiny-arith 0.970"
    assert all(v == "" for r, v in by_run.items() if r not in (fixture.runs[("bundled", last)],
                                                                fixture.runs[("vllm", last)]))


@pytest.mark.slow
def test_run_page_lists_the_runs_evaluations(fixture, monkeypatch):
    monkeypatch.setenv("K2BENCH_DB", fixture.url)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["page"] = "Run detail"
    at.query_params["run"] = str(fixture.runs[("bundled", len(fxdb.COMMITS) - 1)])
    at.run()
    assert not at.exception
    assert "Accuracy" in [h.value for h in at.subheader]
    evals = next(d.value for d in at.dataframe if "task" in d.value.columns)
    assert evals.to_dict("records") == [{"task": "tiny-arith", "metric": "exact_match", "value": 0.8,
                                         "stderr": 0.01, "n": 500, "concurrency": 8}]
