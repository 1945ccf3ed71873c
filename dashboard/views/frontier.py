"""Frontier page: tok/s/GPU against tok/s/user per configuration, with alternative views."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from k2bench.dashboard import charts, data, labels
from k2bench.dashboard.reference import load_reference, matching
from k2bench.dashboard.views.common import csv_download, slo_input, table_columns
from k2bench.harness.analysis.mdsafe import md_text
from k2bench.harness.measure.slo import Slo

MODES = ("Latest run per configuration", "Median over runs in range")
TABLE_COLUMNS = ["config", "concurrency", "tput_per_gpu", "interactivity_median", "ttft_ms_median",
                 "tpot_ms_median", "e2el_ms_median", "tokens_per_j", "usd_per_mtok", "pct_roofline",
                 "slo_attainment", "goodput_rps", "goodput_per_gpu"]


def sidebar_filters(runs: pd.DataFrame) -> pd.DataFrame:
    st.sidebar.subheader("Filters")
    chosen = {}
    for col in data.FILTER_COLUMNS:
        values = sorted(v for v in runs[col].dropna().unique())
        chosen[col] = st.sidebar.multiselect(col.capitalize(), values, key=f"filter_{col}")
    first, last = runs["started_at"].min().date(), runs["started_at"].max().date()
    dates = st.sidebar.date_input("Date range", value=(first, last), min_value=first, max_value=last,
                                  key="filter_dates")
    date_range = dates if isinstance(dates, (tuple, list)) and len(dates) == 2 else None
    return data.filter_points(runs, chosen, date_range)


def runs_to_load(selected: pd.DataFrame, mode: str) -> tuple[int, ...]:
    """Only the latest run of each configuration is read unless the median over runs is asked for."""
    ids = data.latest_run_ids(selected) if mode == MODES[0] else selected["run_id"]
    return tuple(sorted(int(i) for i in ids))


def build(points: pd.DataFrame, view_name: str, mode: str, reference: pd.DataFrame | None, log: bool,
          invalid: pd.DataFrame | None = None, slo: Slo | None = None):
    """The page's table and figure from the selected runs' valid points (also timed by
    bench/dashboard_bench.py); ``invalid`` levels of those runs, when given, are drawn apart.

    Configurations are named by what tells them apart (labels.short_labels), so legends stay short."""
    names, _ = labels.short_labels(points if invalid is None else pd.concat([points, invalid]))
    levels = data.latest_run_per_config(points) if mode == MODES[0] else data.median_over_runs(points)
    levels = levels.assign(config=levels["config"].map(names))
    if invalid is not None:
        invalid = invalid.assign(config=invalid["config"].map(names))
    fig = charts.frontier_figure(levels, charts.VIEWS[view_name], reference=reference, log=log, invalid=invalid,
                                 slo=slo)
    return levels, fig


def split_valid(points: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(levels that count, invalid levels) of points loaded with their invalid levels."""
    ok = points["valid"].fillna(False).astype(bool) if "valid" in points.columns else pd.Series(True, points.index)
    return points[ok], points[~ok]


def render(url: str, runs: pd.DataFrame) -> None:
    # Streamlit caching only inside a running app: the benchmark imports build() without it
    from k2bench.dashboard import cache

    st.title("Frontier")
    selected = sidebar_filters(runs)
    c1, c2, c3 = st.columns([3, 2, 2])
    views = list(charts.VIEWS)
    wanted = st.query_params.get("view")  # a link may open a view, e.g. ?page=Frontier&view=Cost+vs+interactivity
    view_name = c1.radio("View", views, index=views.index(wanted) if wanted in views else 0, horizontal=True,
                         key="frontier_view")
    mode = c2.selectbox("Points", MODES, key="frontier_mode")
    show_ref = c3.checkbox("Show published reference points", value=True, key="frontier_ref")
    log = c3.checkbox("Log axes", key="frontier_log")
    show_invalid = c3.checkbox("Show invalid levels", value=False, key="frontier_invalid",
                               help="Levels that do not count (failed or timed-out requests, wrong lengths), "
                                    "drawn grey and never part of a frontier; hover for the reason.")
    slo = slo_input(st, selected, "frontier_slo")
    if selected.empty:
        st.warning("No runs match these filters.")
        return
    ids = runs_to_load(selected, mode)
    points = (cache.points_under_slo(url, ids, slo.text, include_invalid=show_invalid) if slo else
              cache.points(url, ids, include_invalid=show_invalid))
    points, invalid = split_valid(points) if show_invalid else (points, None)
    reference, hidden = matching(load_reference(), points) if show_ref else (None, [])
    levels, fig = build(points, view_name, mode, reference, log, invalid, slo)
    st.plotly_chart(fig, key="frontier_chart")
    n_runs = selected["run_id"].nunique()
    _, shared = labels.short_labels(points)
    common = f" All of them: {md_text(shared, None)}." if shared else ""  # stored names: inert in markdown
    st.caption(f"{levels['config'].nunique()} configuration(s), {n_runs} run(s) in the selection.{common} "
               "Labels are concurrency levels; lines join each configuration's Pareto-optimal levels.")
    if invalid is not None:
        st.caption(f"{len(invalid)} invalid level(s) in these runs, drawn as grey crosses and left out of "
                   "every frontier and of the table." if len(invalid) else "No invalid level in these runs.")
    if reference is not None and not reference.empty:
        for name, src in reference[["name", "source"]].drop_duplicates().itertuples(index=False):
            st.caption(f"Reference: {name} — source: {src}")
    for note in hidden:
        st.caption(note)
    cols = [c for c in TABLE_COLUMNS + ["run_id", "commit", "branch", "runs"] if c in levels.columns
            and not (c in data.SLO_COLUMNS and levels[c].isna().all())]
    table = levels[cols].sort_values(["config", "concurrency"]).reset_index(drop=True)
    if "run_id" in table.columns:  # each frontier point's run: its accuracy, marked against the threshold
        ids = tuple(sorted(int(i) for i in table["run_id"].dropna().unique()))
        models = {int(r): m for r, m in selected[["run_id", "model"]].drop_duplicates().itertuples(index=False)}
        table = data.with_accuracy(table, data.accuracy_badges(cache.evals(url, ids), models))
    st.dataframe(table, hide_index=True, column_config=table_columns(table), key="frontier_table")
    csv_download(table, "frontier", key="frontier_csv")
