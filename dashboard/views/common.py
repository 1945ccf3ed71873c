"""Small widgets shared by the pages."""

from __future__ import annotations

import pandas as pd
import streamlit as st


def csv_download(df: pd.DataFrame, name: str, key: str) -> None:
    st.download_button(f"Download {name} as CSV", df.to_csv(index=False).encode(), file_name=f"{name}.csv",
                       mime="text/csv", key=key, on_click="ignore")


def pct_columns(df: pd.DataFrame) -> dict:
    """Signed percentage formatting for the Δ% columns (the CSV keeps plain numbers)."""
    return {c: st.column_config.NumberColumn(c, format="%+.1f%%") for c in df.columns if c.endswith("Δ%")}


def run_param_problem(wanted: str, all_runs: pd.DataFrame) -> str | None:
    """Why a run named in the URL (``?run=N``) cannot be shown, or None when it can.

    ``all_runs`` holds every run, finished levels or not, so that a run that exists but has
    nothing to show is told apart from an id that does not exist."""
    if not wanted.isdigit():
        return f"`run={wanted}` in the address is not a run id (a whole number such as `run=4`)."
    row = all_runs[all_runs["run_id"] == int(wanted)]
    if row.empty:
        return f"There is no run {wanted} in this database. Pick a run below."
    if int(row["levels"].iloc[0]) == 0:
        status = row["status"].iloc[0]
        return (f"Run {wanted} ({status}) has no finished concurrency level, so there is nothing to show. "
                "Pick a run below.")
    return None
