"""The Capacity page: each capacity search's stored result over commits, on a database built through the
real Store (run extra.capacity written by update_run_extra, as `k2bench capacity` does)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from store_helpers import run_meta, write_levels  # noqa: E402
from test_dashboard_pages import figures, open_page  # noqa: E402

from k2bench.dashboard.capacity_charts import capacity_table  # noqa: E402
from k2bench.harness.store import Store  # noqa: E402


def result(capacity: int, missed_at: int, goodput: float) -> dict:
    below = {"load": capacity, "met": 40, "n": 40, "attainment": 1.0, "low": 0.91, "high": 1.0, "meets": True,
             "valid": True}
    above = {**below, "load": missed_at, "met": 0, "attainment": 0.0, "low": 0.0, "high": 0.09, "meets": False}
    return {"by": "concurrency", "slo": "tpot_ms=43", "target": 0.99, "tolerance": 0.1, "max_probes": 8,
            "capacity": capacity, "status": "bracketed", "goodput_per_gpu": goodput, "goodput_rps": 1.0,
            "below": below, "above": above, "probes": [below, above], "note": None}


@pytest.fixture
def capacity_db(db_url: str) -> str:
    for i, (cap, miss, good) in enumerate([(20, 22, 700.0), (15, 16, 520.0)]):
        run_id = write_levels(db_url, [4, 8], meta=run_meta(commit=f"{i + 1}" * 40, extra={"base_url": "u"},
                                                             started_at=f"2026-11-2{i}T12:00:00Z"))
        with Store.open(db_url) as store:
            store.update_run_extra(run_id, {"capacity": result(cap, miss, good)})
    write_levels(db_url, [4], meta=run_meta(commit="9" * 40))  # a plain sweep: not on the page
    return db_url


def test_capacity_table_holds_each_search_oldest_first(capacity_db: str) -> None:
    with Store.open(capacity_db, readonly=True) as store:
        table = capacity_table(store.list_runs())
        extra = store.get_run(1)["extra"]
    assert table["capacity"].tolist() == [20, 15] and table["missed_at"].tolist() == [22, 16]
    assert table["goodput_per_gpu"].tolist() == [700.0, 520.0]
    assert table["search"].unique().tolist() == ["by concurrency at tpot_ms=43, target 99%"]
    assert extra["capacity"]["capacity"] == 20 and extra["base_url"] == "u"  # merged beside what the run had


def test_capacity_page_draws_capacity_with_its_bracket_and_goodput(capacity_db: str, monkeypatch) -> None:
    at = open_page(capacity_db, "Capacity", monkeypatch)
    (fig,) = figures(at)
    cap, good = fig["data"]
    assert cap["y"] == [20, 15] and cap["error_y"]["array"] == [2, 1]
    assert good["y"] == [700.0, 520.0]
    assert len(at.dataframe[0].value) == 2


def test_capacity_page_without_a_search_says_how_to_make_one(tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path}/k.db"
    write_levels(url, [4])
    at = open_page(url, "Capacity", monkeypatch)
    assert "k2bench capacity --slo" in at.info[0].value
