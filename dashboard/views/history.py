"""History page: one metric at one concurrency across commits and time, change points and bisected
culprits marked, each commit linked to its page (K2BENCH_COMMIT_URL)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from k2bench.dashboard import cache, charts, data, labels
from k2bench.dashboard.views.common import csv_download, table_columns
from k2bench.harness.analysis.changepoints import DEFAULT_MIN_SIZE

# a change-point scan needs this many runs of one series: min_size on each side of a split
MIN_RUNS_FOR_SCAN = 2 * DEFAULT_MIN_SIZE

ALL = "(all branches)"


def config_options(runs: pd.DataFrame) -> dict[str, str]:
    """fingerprint -> label, most recently run configuration first.

    A label leads with what tells the configurations apart and then names the rest, so a picker
    cut short by the page width still shows the difference."""
    latest = runs.groupby("fingerprint")["started_at"].max().sort_values(ascending=False, kind="stable")
    names, shared = labels.short_labels(runs, key="fingerprint")
    tail = f"{labels.SEP}{shared}" if shared else ""
    return {fp: f"{names[fp]}{tail}" for fp in latest.index}


def render(url: str, runs: pd.DataFrame) -> None:
    st.title("History")
    configs = config_options(runs)
    fp = st.selectbox("Configuration", list(configs), format_func=configs.get, key="history_config")
    points = cache.points(url, tuple(sorted(int(r) for r in runs.loc[runs["fingerprint"] == fp, "run_id"])))
    c1, c2, c3, c4 = st.columns(4)
    branch = c1.selectbox("Branch", [ALL, *sorted(points["branch"].dropna().unique())], key="history_branch")
    # closed levels (c8) by concurrency, then rate levels (r2/s) by rate: the two kinds are separate series
    kinds = points.drop_duplicates("level").sort_values(["mode", "rate", "concurrency"], na_position="first")
    levels = list(kinds["level"])
    closed = [lv for lv in levels if lv.startswith("c")]
    level = c2.selectbox("Level", levels, index=levels.index(closed[-1]) if closed else 0, key="history_conc",
                         help="cN: N requests in flight (closed loop); rR/s: R requests/s (open loop)")
    conc = int(kinds.loc[kinds["level"] == level, "concurrency"].iloc[0])
    metric = c3.selectbox("Metric", list(data.METRICS), format_func=lambda m: data.METRICS[m].label,
                          key="history_metric")
    by_commit = c4.radio("X axis", ["time", "commit order"], horizontal=True, key="history_x") == "commit order"
    y_axis = c4.radio("Y axis", charts.Y_AXES, horizontal=True, key="history_y")
    br = None if branch == ALL else branch
    series = data.history_series(points, fp, conc, metric, br, level=level)
    if series.empty:
        st.warning("No runs of this configuration at this level.")
        return
    stored = cache.change_points(url, fp, br)
    marks = data.mark_change_points(stored, metric, conc, level=level)
    marks = marks[marks["run_id"].isin(series["run_id"])] if not marks.empty else marks
    culprits = data.mark_culprits(cache.culprits(url, br) if level.startswith("c") else None, series, metric, conc)
    st.plotly_chart(charts.history_figure(series, metric, marks, by_commit=by_commit, y_axis=y_axis,
                                          culprits=culprits),
                    key="history_chart")
    regressions = marks[marks["kind"] == "regression"] if not marks.empty else marks
    if not regressions.empty:
        lines = [f"commit `{str(r.commit)[:10]}`: {r.rel_change * 100:+.1f}% (p={r.p_value:.2g})"
                 for r in regressions.itertuples()]
        st.error(f"{len(regressions)} regression(s) flagged in {data.METRICS[metric].label} "
                 f"at {_where(level)}: " + "; ".join(lines))
    elif marks.empty:
        st.caption(no_change_point_note(stored, len(series), data.METRICS[metric].label, conc, level))
    else:
        st.success(f"{len(marks)} change point(s), none of them a regression.")
    st.caption(f"{len(series)} run(s). Hover a point for its commit, branch and date.")
    columns = table_columns(series)
    if data.commit_url("0"):
        columns["commit"] = st.column_config.LinkColumn("commit", display_text=r"/commit/([0-9a-f]{10})")
    table = series.assign(commit=[data.commit_url(c) or c for c in series["commit"]])
    st.dataframe(table, hide_index=True, column_config=columns, key="history_table")
    csv_download(series, "history", key="history_csv")
    if not culprits.empty:
        st.subheader("Bisected culprits")
        st.caption("`k2bench bisect` named these commits as the first bad ones; each is marked on the first "
                   "run after it.")
        shown = culprits.assign(first_bad=[data.commit_url(c) or c for c in culprits["first_bad"]])
        shown = shown[["first_bad", "subject", "good", "bad", "run_id"]]
        culprit_columns = table_columns(shown)
        if data.commit_url("0"):
            culprit_columns["first_bad"] = st.column_config.LinkColumn(
                "culprit", display_text=r"/commit/([0-9a-f]{10})")
        st.dataframe(shown, hide_index=True, key="history_culprits", column_config=culprit_columns)
    if not marks.empty:
        st.subheader("Change points")
        cp = marks[["commit", "run_id", "rel_change", "p_value", "kind", "mean_before", "mean_after"]]
        m = data.METRICS[metric]
        means = {c: st.column_config.NumberColumn(f"{word} ({m.unit})", format=f"%.{m.decimals}f")
                 for c, word in (("mean_before", "mean before"), ("mean_after", "mean after"))}
        st.dataframe(cp, hide_index=True, column_config=table_columns(cp) | means, key="history_cp_table")


def _where(level: str) -> str:
    """A level in a sentence: "concurrency 8" for c8, "rate 2/s" for r2/s."""
    return f"concurrency {level[1:]}" if level.startswith("c") else f"rate {level[1:].strip()}"


def no_change_point_note(stored: pd.DataFrame, n_runs: int, metric_label: str, conc: int,
                         level: str | None = None) -> str:
    """What an empty change-point record means here. The store keeps only what a scan found, so a
    scan that found nothing leaves no trace: the note never claims a scan is missing."""
    here = f"No change point recorded for {metric_label} at {_where(level or f'c{conc}')}"
    if not stored.empty:  # this configuration has been scanned: the other metrics and levels show it
        return f"{here}; the scan found changes only elsewhere in this configuration."
    if n_runs < MIN_RUNS_FOR_SCAN:
        return (f"{here}: a change-point scan needs at least {MIN_RUNS_FOR_SCAN} runs of a configuration "
                f"and this series has {n_runs}.")
    return f"{here}. `k2bench changepoints` scans the history and records only the changes it finds."
