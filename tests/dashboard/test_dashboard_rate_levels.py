"""The dashboard's data layer keeps rate levels apart from closed levels of the same concurrency."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from k2bench.dashboard import data


def frame() -> pd.DataFrame:
    """Two runs of one configuration, each with c4 (closed), r2/s and r inf (both capped at 4)."""
    rows = []
    for run_id, day in ((1, "2026-12-01"), (2, "2026-12-02")):
        for mode, rate, tput in (("closed", None, 100.0), ("rate", 2.0, 20.0), ("rate", math.inf, 90.0)):
            for trial in (0, 1):
                rows.append({"run_id": run_id, "fingerprint": "f", "engine": "e", "model": "m", "branch": "main",
                             "commit": f"c{run_id}", "status": "complete", "started_at": pd.Timestamp(day, tz="UTC"),
                             "mode": mode, "rate": rate, "concurrency": 4, "trial": trial,
                             "tput_per_gpu": tput + run_id + trial, "valid": True})
    df = pd.DataFrame(rows)
    df["config"] = data.config_labels(df)
    return data.with_levels(df)


def test_levels_are_labelled_and_rate_levels_get_their_own_configuration_line() -> None:
    df = frame()
    assert sorted(set(df["level"])) == ["c4", "r inf", "r2/s"]
    closed, rate = df[df["mode"] == "closed"], df[df["mode"] == "rate"]
    assert set(rate["config"]) == {closed["config"].iloc[0] + data.OPEN_LOOP}


def test_trials_reduce_within_a_level_never_across_kinds() -> None:
    levels = data.per_run_levels(frame())
    assert len(levels) == 6  # 2 runs x 3 levels
    got = {(r.run_id, r.level): r.tput_per_gpu for r in levels.itertuples()}
    assert got[(1, "c4")] == pytest.approx(101.5) and got[(1, "r2/s")] == pytest.approx(21.5)
    assert got[(2, "r inf")] == pytest.approx(92.5)
    pooled = data.median_over_runs(frame())
    assert len(pooled) == 3 and set(pooled["concurrency"]) == {4}


def test_history_of_a_rate_level_is_that_level_alone() -> None:
    series = data.history_series(frame(), "f", 4, "tput_per_gpu", level="r2/s")
    assert list(series["tput_per_gpu"]) == pytest.approx([21.5, 22.5])
    closed = data.history_series(frame(), "f", 4, "tput_per_gpu")
    assert list(closed["tput_per_gpu"]) == pytest.approx([101.5, 102.5])


def test_change_points_are_matched_to_their_level_kind() -> None:
    cps = pd.DataFrame([{"metric": "tpot_ms_median", "mode": "rate", "rate": 2.0, "concurrency": 4, "run_id": 2,
                         "commit": "c2", "rel_change": 0.3, "p_value": 0.001},
                        {"metric": "tpot_ms_median", "mode": None, "rate": None, "concurrency": 4, "run_id": 2,
                         "commit": "c2", "rel_change": -0.2, "p_value": 0.001}])
    rate = data.mark_change_points(cps, "tpot_ms_median", 4, level="r2/s")
    closed = data.mark_change_points(cps, "tpot_ms_median", 4)
    assert list(rate["rel_change"]) == [0.3] and list(closed["rel_change"]) == [-0.2]
