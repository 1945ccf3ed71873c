"""History page: one metric at one concurrency across commits and time, change points and bisected
culprits marked, each commit linked to its page (K2BENCH_COMMIT_URL)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from k2bench.dashboard import cache, charts, data
from k2bench.dashboard.views.common import csv_download

ALL = "(all branches)"


def config_options(runs: pd.DataFrame) -> dict[str, str]:
    """fingerprint -> label, most recently run configuration first."""
    latest = runs.groupby("fingerprint")["started_at"].max().sort_values(ascending=False, kind="stable")
    labels = runs.drop_duplicates("fingerprint").set_index("fingerprint")["config"]
    return {fp: labels[fp] for fp in latest.index}


def render(url: str, runs: pd.DataFrame) -> None:
    st.title("History")
    configs = config_options(runs)
    fp = st.selectbox("Configuration", list(configs), format_func=configs.get, key="history_config")
    points = cache.points(url, tuple(sorted(int(r) for r in runs.loc[runs["fingerprint"] == fp, "run_id"])))
    c1, c2, c3, c4 = st.columns(4)
    branch = c1.selectbox("Branch", [ALL, *sorted(points["branch"].dropna().unique())], key="history_branch")
    levels = sorted(int(c) for c in points["concurrency"].unique())
    conc = c2.selectbox("Concurrency", levels, index=len(levels) - 1, key="history_conc")
    metric = c3.selectbox("Metric", list(data.METRICS), format_func=lambda m: data.METRICS[m].label,
                          key="history_metric")
    by_commit = c4.radio("X axis", ["time", "commit order"], horizontal=True, key="history_x") == "commit order"
    br = None if branch == ALL else branch
    series = data.history_series(points, fp, conc, metric, br)
    if series.empty:
        st.warning("No runs of this configuration at this concurrency.")
        return
    marks = data.mark_change_points(cache.change_points(url, fp, br), metric, conc)
    marks = marks[marks["run_id"].isin(series["run_id"])] if not marks.empty else marks
    culprits = data.mark_culprits(cache.culprits(url, br), series, metric, conc)
    st.plotly_chart(charts.history_figure(series, metric, marks, by_commit=by_commit, culprits=culprits),
                    key="history_chart")
    regressions = marks[marks["kind"] == "regression"] if not marks.empty else marks
    if not regressions.empty:
        lines = [f"commit `{str(r.commit)[:10]}`: {r.rel_change * 100:+.1f}% (p={r.p_value:.2g})"
                 for r in regressions.itertuples()]
        st.error(f"{len(regressions)} regression(s) flagged in {data.METRICS[metric].label} "
                 f"at concurrency {conc}: " + "; ".join(lines))
    elif marks.empty:
        st.caption("No change points recorded for this metric and level (run `k2bench changepoints`).")
    else:
        st.success(f"{len(marks)} change point(s), none of them a regression.")
    st.caption(f"{len(series)} run(s). Hover a point for its commit, branch and date.")
    links = {"commit": st.column_config.LinkColumn("commit", display_text=r"/commit/([0-9a-f]{10})")}
    table = series.assign(commit=[data.commit_url(c) or c for c in series["commit"]])
    st.dataframe(table, hide_index=True, key="history_table",
                 column_config=links if data.commit_url("0") else None)
    csv_download(series, "history", key="history_csv")
    if not culprits.empty:
        st.subheader("Bisected culprits")
        st.caption("`k2bench bisect` named these commits as the first bad ones; each is marked on the first "
                   "run after it.")
        shown = culprits.assign(first_bad=[data.commit_url(c) or c for c in culprits["first_bad"]])
        st.dataframe(shown[["first_bad", "subject", "good", "bad", "run_id"]], hide_index=True,
                     key="history_culprits", column_config={"first_bad": st.column_config.LinkColumn(
                         "culprit", display_text=r"/commit/([0-9a-f]{10})")} if data.commit_url("0") else None)
    if not marks.empty:
        st.subheader("Change points")
        cp = marks[["commit", "run_id", "rel_change", "p_value", "kind", "mean_before", "mean_after"]]
        st.dataframe(cp, hide_index=True, key="history_cp_table")
