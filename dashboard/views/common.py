"""Small widgets shared by the pages."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from k2bench.dashboard import data
from k2bench.errors import UserError
from k2bench.harness.measure.catalogue import BY_COLUMN, FIELDS, LEVEL_TABLE_FIELDS, TTFT_GAP
from k2bench.harness.measure.slo import Slo, parse_slo

_LEVEL_FIELDS = {f.column: f for f in (*LEVEL_TABLE_FIELDS, TTFT_GAP)}


def csv_download(df: pd.DataFrame, name: str, key: str) -> None:
    st.download_button(f"Download {name} as CSV", df.to_csv(index=False).encode(), file_name=f"{name}.csv",
                       mime="text/csv", key=key, on_click="ignore")


# Plain headers for the run and configuration columns a table may carry beside its metrics (the
# catalogue's fields; concurrency, trial, failed and valid keep their raw names on the dashboard).
_PLAIN_HEADERS = {c: f.header for c, f in FIELDS.items() if c not in ("concurrency", "trial", "failed", "valid")}
# " A", " B": one side of a comparison; " Δ%": B relative to A in percent (data.delta_table)
_SIDES = (" A", " B", " Δ%")


def table_columns(df: pd.DataFrame) -> dict:
    """Streamlit column settings for a table: every metric's header, unit and decimals from the metric
    catalogue, per-level numbers and plain words for run columns from the catalogue's fields. Only what is shown
    changes: sorting uses the full values and the CSV download keeps the raw names and values."""
    out = {}
    for col in df.columns:
        side = next((s for s in _SIDES if col.endswith(s)), "")
        base = col[: len(col) - len(side)]
        metric, spec = BY_COLUMN.get(base), _LEVEL_FIELDS.get(base)
        if side == " Δ%" or col == "Δ%":
            what = metric.header if metric else base
            out[col] = st.column_config.NumberColumn(f"{what} Δ%".strip(), format="%+.1f%%",
                                                     help="B relative to A, in percent")
        elif metric is not None:
            out[col] = st.column_config.NumberColumn(f"{metric.header}{side}", format=f"%.{metric.decimals}f",
                                                     help=metric.label)
        elif spec is not None:
            out[col] = st.column_config.NumberColumn(f"{spec.header}{side}", format=f"%.{spec.decimals}f",
                                                     help=spec.label)
        elif col == "started_at":
            out[col] = st.column_config.DatetimeColumn(_PLAIN_HEADERS[col], format="YYYY-MM-DD HH:mm")
        elif col == "rel_change":
            out[col] = st.column_config.NumberColumn(_PLAIN_HEADERS[col], format="percent")
        elif col in _PLAIN_HEADERS:
            out[col] = st.column_config.Column(_PLAIN_HEADERS[col])
    return out


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


SLO_HELP = ("NAME=MS bounds, e.g. ttft_ms=2000,tpot_ms=50 (names: ttft_ms, tpot_ms, e2el_ms, itl_p99_ms). Drawn "
            "where the axes show them (a TPOT bound is a floor on tok/s/user); each point's attainment, with its "
            "95% interval, is on hover, computed from the stored requests. Starts with the newest run's SLO.")


def slo_input(container, runs: pd.DataFrame, key: str) -> Slo | None:
    """The SLO box: the SLO the page judges by (None when empty or malformed; the error is shown)."""
    text = container.text_input("SLO", value=data.newest_slo(runs), help=SLO_HELP, key=key).strip()
    if not text:
        return None
    try:
        return parse_slo(text)
    except UserError as exc:
        container.error(str(exc))
        return None
