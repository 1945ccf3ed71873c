"""The analysis on runs holding both level kinds: a rate level and a closed level of the same concurrency are
compared, scanned and stored apart (the gate, change points, the store's change-point table)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from store_helpers import make_level, run_meta

from k2bench.harness.analysis import regress
from k2bench.harness.analysis.changepoints import history_change_points
from k2bench.harness.analysis.report import markdown
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.store import Store


def _level(conc: int, slow: float, seed: int, rate: float | None) -> tuple[dict, list]:
    """A level whose token stamps are stretched by ``slow`` (1.0: as made)."""
    recs = make_level(conc, n=16, seed=seed)
    for r in recs:
        r.token_ns = [r.send_ns + int((t - r.send_ns) * slow) for t in r.token_ns]
        r.end_ns = r.token_ns[-1] + 300_000
        if rate is not None:
            r.mode, r.rate, r.intended_ns, r.queue_ns = "rate", rate, r.send_ns - 1000, 0
    point = summarize_level(recs, concurrency=conc, num_gpus=2)
    point["valid"], point["invalid_reason"] = True, None
    if rate is not None:
        point.update(mode="rate", rate=rate, achieved_rate=rate if math.isfinite(rate) else None, send_lag_p50_ms=0.001, send_lag_p99_ms=0.001,
                     queue_p50_ms=0.0, queue_p99_ms=0.0)
    return point, recs


def add_run(store: Store, i: int, closed_slow: float, rate_slow: float, rate: float = 2.0) -> int:
    run_id = store.create_run(run_meta(commit=f"c{i:03d}", started_at=f"2026-12-01T{i:02d}:00:00Z"))
    for point, recs in (_level(4, closed_slow, i, None), _level(4, rate_slow, i, rate)):
        store.add_point(run_id, point, recs)
    store.finish_run(run_id, "complete")
    return run_id


@pytest.fixture()
def store(db_url):
    with Store.open(db_url) as s:
        yield s


def test_a_run_holds_a_rate_and_a_closed_level_of_one_concurrency_and_refuses_a_second_of_either(store) -> None:
    from k2bench.errors import UserError

    run_id = add_run(store, 1, 1.0, 1.0)
    frame = store.points_frame([run_id])
    assert sorted(frame["mode"]) == ["closed", "rate"] and set(frame["concurrency"]) == {4}
    for rate in (None, 2.0):
        point, recs = _level(4, 1.0, 1, rate)
        with pytest.raises(UserError, match="already has a level"):
            store.add_point(run_id, point, recs)
    point, recs = _level(4, 1.0, 1, math.inf)  # another rate is another level
    store.add_point(run_id, point, recs)
    assert len(store.points_frame([run_id])) == 3


def test_the_gate_compares_each_kind_with_its_own_kind(store) -> None:
    """The candidate's rate level is 40% slower and its closed level unchanged: the change is the rate
    level's alone (mixed together, one verdict would show half of it)."""
    base = add_run(store, 1, 1.0, 1.0)
    cand = add_run(store, 2, 1.0, 1.4)
    frame = store.points_frame()
    reqs = {rid: store.requests_frame(rid) for rid in (base, cand)}
    res = regress.compare(frame[frame.run_id == cand], frame[frame.run_id == base],
                          cand_requests=reqs[cand], base_requests=reqs[base])
    tpot = {(v.mode, v.rate): v for v in res.verdicts if v.metric == "tpot_ms_median"}
    assert set(tpot) == {("closed", None), ("rate", 2.0)}
    assert tpot[("closed", None)].rel_change == pytest.approx(0, abs=0.01)
    assert tpot[("rate", 2.0)].rel_change == pytest.approx(0.4, rel=0.05)
    # one run a side cannot confirm a change (the gate's rule): flagged beyond the threshold, unconfirmed
    assert tpot[("rate", 2.0)].status == "unconfirmed" and tpot[("closed", None)].status == "unchanged"
    assert "r2/s (cap 4)" in markdown(res)


def test_change_points_are_found_and_stored_per_level_kind(store) -> None:
    ids = [add_run(store, i, 1.0, 1.0 if i < 8 else 1.5) for i in range(16)]
    frame = store.points_frame(ids)
    rows = history_change_points(frame, metrics=("tpot_ms_median",))
    assert [(r["mode"], r["rate"], r["concurrency"]) for r in rows] == [("rate", 2.0, 4)]
    assert rows[0]["run_id"] == ids[8]
    store.replace_change_points(frame["fingerprint"].iloc[0], "main", rows)
    stored = store.change_points_frame(branch="main")
    assert list(zip(stored["mode"], stored["rate"], stored["concurrency"], strict=True)) == [("rate", 2.0, 4)]


def test_old_change_point_rows_read_as_closed(store) -> None:
    row = {"metric": "tpot_ms_median", "concurrency": 4, "run_id": 1, "commit": "c", "detected_at": None,
           "mean_before": 1.0, "mean_after": 2.0, "rel_change": 1.0, "p_value": 0.001}
    store.replace_change_points("f", "main", [row])
    assert list(store.change_points_frame(branch="main")["mode"]) == ["closed"]


def test_verdicts_keep_their_kind_in_the_json(store) -> None:
    base, cand = add_run(store, 1, 1.0, 1.0), add_run(store, 2, 1.0, 1.0)
    frame = store.points_frame()
    res = regress.compare(frame[frame.run_id == cand], frame[frame.run_id == base])
    kinds = {(v["mode"], v["rate"]) for v in res.to_dict()["verdicts"]}
    assert kinds == {("closed", None), ("rate", 2.0)}
    assert all(dataclasses.is_dataclass(v) for v in res.verdicts)
