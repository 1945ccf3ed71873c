"""One trial aggregation everywhere: the gate, the change-point scan and the dashboard read the
same per-run value from repeated trials. The gate used to take the mean and the dashboard the
median, so one bad trial out of three was a 20% drop at the gate and nothing on the dashboard."""

from __future__ import annotations

import statistics

import pandas as pd

from k2bench.dashboard import data
from k2bench.harness.analysis import changepoints, regress

TRIALS = [100.0, 100.0, 40.0]  # one disturbed trial: mean 80, median 100


def _points(run_id: int, values: list[float], started: str) -> pd.DataFrame:
    n = len(values)
    return pd.DataFrame({
        "run_id": [run_id] * n, "concurrency": [8] * n, "trial": list(range(n)),
        "tput_per_gpu": values, "interactivity_median": [20.0] * n,
        "commit": [f"c{run_id}"] * n, "started_at": [pd.Timestamp(started, tz="UTC")] * n,
    })


def test_gate_dashboard_and_change_points_agree_on_a_run_with_one_bad_trial():
    base = _points(1, [100.0, 100.0, 100.0], "2026-11-01")
    cand = _points(2, TRIALS, "2026-11-02")
    want = statistics.median(TRIALS)

    gate_value = regress.per_run(cand)["tput_per_gpu"].item()
    dash_value = data.per_run_levels(cand)["tput_per_gpu"].item()
    assert gate_value == dash_value == want

    res = regress.compare(cand, base)
    v = next(v for v in res.verdicts if v.metric == "tput_per_gpu")
    assert v.candidate == want and v.status == "unchanged"  # with the mean: 80, "unconfirmed" -20%

    # the change-point scan reduces a run's trials the same way: a step in medians is found where it is
    history = pd.concat([_points(i, [100.0, 100.0, 40.0] if i < 8 else [150.0, 150.0, 40.0], f"2026-11-{i + 1:02d}")
                         for i in range(16)], ignore_index=True)
    rows = changepoints.history_change_points(history, metrics=("tput_per_gpu",))
    assert [(r["run_id"], r["mean_before"], r["mean_after"]) for r in rows] == [(8, 100.0, 150.0)]
