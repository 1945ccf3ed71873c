"""Streamlit-cached, read-only queries. The store is opened once per URL; query results are kept
for a short time so that a sweep finishing in another process shows up on the next refresh."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from k2bench.dashboard import data

TTL_S = 30


@st.cache_resource(show_spinner=False)
def store(url: str):
    return data.open_store(url)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def runs(url: str) -> pd.DataFrame:
    return data.load_runs(store(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def points(url: str, run_ids: tuple[int, ...], include_invalid: bool = False) -> pd.DataFrame:
    return data.load_points(store(url), run_ids, include_invalid)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def points_under_slo(url: str, run_ids: tuple[int, ...], slo: str, include_invalid: bool = False) -> pd.DataFrame:
    return data.with_slo(store(url), points(url, run_ids, include_invalid), slo)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def requests(url: str, run_id: int, concurrency: int | None) -> pd.DataFrame:
    return store(url).requests_frame(run_id, concurrency=concurrency)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def itl(url: str, run_id: int, concurrency: int) -> np.ndarray:
    return np.asarray(store(url).itl_ms(run_id, concurrency), dtype=float)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def change_points(url: str, fingerprint: str, branch: str | None) -> pd.DataFrame:
    return store(url).change_points_frame(fingerprint=fingerprint, branch=branch)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def culprits(url: str, branch: str | None) -> pd.DataFrame:
    return store(url).culprits_frame(branch=branch)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def run(url: str, run_id: int) -> dict:
    return store(url).get_run(run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def evals(url: str, run_ids: tuple[int, ...]) -> dict[int, list[dict]]:
    return store(url).evals_by_run(run_ids)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def levels(url: str, run_id: int) -> list[dict]:
    """A run's levels with every field, nested ones included (energy, server metrics: the timelines)."""
    return store(url).export_run(run_id)["points"]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def capacity(url: str) -> pd.DataFrame:
    """Every run's capacity search result, oldest first (dashboard.capacity_charts)."""
    from k2bench.dashboard.capacity_charts import capacity_table

    return capacity_table(store(url).list_runs())
