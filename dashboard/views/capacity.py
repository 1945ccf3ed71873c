"""Capacity page: the capacity at an SLO and the goodput there, over commits, per configuration and search
(`k2bench capacity` stores one result per run)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from k2bench.dashboard import cache, capacity_charts
from k2bench.dashboard.views.common import csv_download, table_columns


def render(url: str, runs: pd.DataFrame) -> None:
    st.title("Capacity")
    table = cache.capacity(url)
    if table.empty:
        st.info("No capacity search in this database yet. `k2bench capacity --slo ttft_ms=2000,tpot_ms=50` "
                "finds the highest load whose SLO attainment meets a target and stores it with its run.")
        return
    configs = table.drop_duplicates("fingerprint", keep="last").set_index("fingerprint")["config"]
    fp = st.selectbox("Configuration", list(configs.index)[::-1], format_func=configs.get, key="capacity_config")
    mine = table[table["fingerprint"] == fp]
    searches = list(dict.fromkeys(mine["search"][::-1]))
    search = st.selectbox("Search", searches, key="capacity_search")
    series = mine[mine["search"] == search]
    st.plotly_chart(capacity_charts.capacity_figure(series, search.split()[1]), key="capacity_chart")
    st.caption("The point is the highest load that met the target; its bar reaches the lowest load that "
               "missed, so the true boundary lies inside the bar. `k2bench regress` calls a drop a "
               "regression only when a probe shows it.")
    shown = series.drop(columns=["fingerprint", "config", "search"])
    st.dataframe(shown, hide_index=True, column_config=table_columns(shown), key="capacity_table")
    csv_download(shown, "capacity", key="capacity_csv")
