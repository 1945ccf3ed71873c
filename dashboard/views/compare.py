"""Compare page: two runs or two commits, frontiers overlaid, per-level deltas (B relative to A)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from k2bench.dashboard import cache, charts, data
from k2bench.dashboard.views.common import csv_download, table_columns
from k2bench.dashboard.views.history import config_options


def _pick_runs(url: str, runs: pd.DataFrame):
    runs = data.runs_table(runs)
    labels = {int(r["run_id"]): data.run_label(r) for r in runs.to_dict("records")}
    ids = list(labels)
    # default: the newest run against the previous run of the same configuration
    same = runs.index[(runs["fingerprint"] == runs["fingerprint"].iloc[0]) & (runs.index > 0)]
    a_default = int(same[0]) if len(same) else min(1, len(ids) - 1)
    c1, c2 = st.columns(2)
    a = c1.selectbox("Run A (baseline)", ids, index=a_default, format_func=labels.get, key="compare_run_a")
    b = c2.selectbox("Run B (candidate)", ids, index=0, format_func=labels.get, key="compare_run_b")
    fa, fb = (runs.loc[runs["run_id"] == r, "fingerprint"].iloc[0] for r in (a, b))
    if fa != fb:
        st.warning(f"Runs A and B have different configurations (fingerprints {fa} and {fb}); "
                   "their numbers are not like for like.")
    points = cache.points(url, tuple(sorted({int(a), int(b)})))
    la = data.per_run_levels(points[points["run_id"] == a])
    lb = data.per_run_levels(points[points["run_id"] == b])
    return la, lb, f"A: run #{a}", f"B: run #{b}"


def _pick_commits(url: str, runs: pd.DataFrame):
    configs = config_options(runs)
    fp = st.selectbox("Configuration", list(configs), format_func=configs.get, key="compare_config")
    sel_runs = runs[runs["fingerprint"] == fp]
    commits = list(sel_runs.groupby("commit")["started_at"].min().sort_values(ascending=False).index)
    c1, c2 = st.columns(2)
    a = c1.selectbox("Commit A (baseline)", commits, index=min(1, len(commits) - 1), key="compare_commit_a")
    b = c2.selectbox("Commit B (candidate)", commits, index=0, key="compare_commit_b")
    ids = sel_runs.loc[sel_runs["commit"].isin([a, b]), "run_id"]
    sel = cache.points(url, tuple(sorted(int(r) for r in ids)))
    la = data.median_over_runs(sel[sel["commit"] == a], by="commit")
    lb = data.median_over_runs(sel[sel["commit"] == b], by="commit")
    return la, lb, f"A: {str(a)[:10]}", f"B: {str(b)[:10]}"


def render(url: str, runs: pd.DataFrame) -> None:
    st.title("Compare")
    mode = st.radio("Compare", ["Two runs", "Two commits"], horizontal=True, key="compare_mode")
    la, lb, name_a, name_b = _pick_runs(url, runs) if mode == "Two runs" else _pick_commits(url, runs)
    both = pd.concat([la.assign(side=name_a), lb.assign(side=name_b)], ignore_index=True)
    view = charts.VIEWS["Throughput vs interactivity"]
    fig = charts.frontier_figure(both, view, by="side", title=f"Frontiers: {name_a} vs {name_b}")
    st.plotly_chart(fig, key="compare_chart")

    deltas = data.delta_table(la, lb)
    if deltas.empty:
        st.warning("A and B share no concurrency level.")
    else:
        peak_a, peak_b = la["tput_per_gpu"].max(), lb["tput_per_gpu"].max()
        c1, c2 = st.columns(2)
        tput, inter = data.METRICS["tput_per_gpu"], data.METRICS["interactivity_median"]
        c1.metric(f"Peak throughput B ({tput.unit})", tput.format(peak_b),
                  delta=f"{(peak_b / peak_a - 1) * 100:+.1f}% vs A")
        ia, ib = la["interactivity_median"].max(), lb["interactivity_median"].max()
        c2.metric(f"Best interactivity B ({inter.unit})", inter.format(ib), delta=f"{(ib / ia - 1) * 100:+.1f}% vs A")
        st.subheader("Per-concurrency deltas (B relative to A)")
        st.dataframe(deltas, hide_index=True, column_config=table_columns(deltas), key="compare_deltas")
        csv_download(deltas, "compare_deltas", key="compare_csv")

    st.subheader("Throughput at matched interactivity")
    shift = data.compare_frontiers(la, lb)
    matched = data.matched_interactivity(la, lb, comparison=shift)
    if matched.empty:
        st.info("The two frontiers do not overlap in interactivity, so there is nothing to match.")
    else:
        lo, hi = shift.overlap
        st.metric("Throughput of B at matched interactivity", f"{shift.geo_mean_ratio:.3f}x A",
                  delta=f"{shift.shift * 100:+.1f}% vs A")
        st.caption(f"Geometric mean over the interactivity both frontiers cover ({lo:.3g} to {hi:.3g} tok/s/user); "
                   "below, A's frontier levels with B's throughput interpolated along B's frontier "
                   "(log-log, no extrapolation).")
        st.dataframe(matched, hide_index=True, column_config=table_columns(matched), key="compare_matched")
        csv_download(matched, "compare_matched", key="compare_matched_csv")
