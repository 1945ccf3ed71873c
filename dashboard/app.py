"""Streamlit entry point of the k2bench dashboard: `k2bench dashboard` runs `streamlit run` on this file.

The database URL comes from --db after `--` on the streamlit command line, else the K2BENCH_DB
environment variable, else the store's default. The dashboard only reads.
"""

from __future__ import annotations

import argparse
import sys

import streamlit as st

from k2bench.dashboard import cache, data
from k2bench.dashboard.views import capacity, compare, frontier, history, run_detail
from k2bench.errors import UserError

PAGES = {"Frontier": frontier.render, "History": history.render, "Compare": compare.render,
         "Run detail": run_detail.render, "Capacity": capacity.render}


def _db_arg() -> str | None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--db")
    known, _ = parser.parse_known_args(sys.argv[1:])
    return known.db


def _display_url(url: str) -> str:
    from k2bench.harness.store.db import safe_url

    return safe_url(url)


# A first sweep that finishes in minutes on a small CPU machine (the bundled engine's tiny model), and
# the design card's sweep, which takes hours there and belongs on a GPU node.
QUICK_SWEEP = "k2bench sweep --isl 512 --osl 64 --conc 4..16"
FULL_SWEEP = "k2bench sweep --isl 8192 --osl 1024 --conc 4..128"


def first_run_message(url: str, reason: str | None = None) -> None:
    st.title("k2bench dashboard")
    st.info(reason or f"No benchmark runs in this database yet ({_display_url(url)}).")
    db = "" if url == _default_url() else f" --db '{_display_url(url)}'"
    st.markdown("Record a first sweep into it: the bundled engine with its tiny model, a few minutes on a laptop CPU:")
    st.code(f"{QUICK_SWEEP}{db}", language="bash")
    st.markdown("The design card's sweep (ISL 8192 / OSL 1024, concurrency 4 to 128) takes hours on a CPU; "
                "run it on a GPU node, with the bundled engine or against a server you started (`--url`, "
                "`--gpus` for how many GPUs it uses):")
    st.code(f"{FULL_SWEEP}{db}\n{FULL_SWEEP} --url http://gpu-node:8000 --gpus 4{db}", language="bash")
    st.markdown("or import a run saved as JSON:")
    st.code(f"k2bench import run.json{db}", language="bash")
    st.caption("Then reload this page.")


def _default_url() -> str:
    from k2bench.harness.store.db import DEFAULT_DB_URL

    return DEFAULT_DB_URL


def main() -> None:
    st.set_page_config(page_title="k2bench", layout="wide")
    url = data.resolve_db_url(_db_arg())
    names = list(PAGES)
    wanted = st.query_params.get("page", names[0])
    page = st.sidebar.radio("Page", names, index=names.index(wanted) if wanted in names else 0, key="page")
    if st.query_params.get("page") != page:
        st.query_params["page"] = page
    st.sidebar.caption(f"Database: `{_display_url(url)}` (read-only)")
    try:
        runs = cache.runs(url)
    except UserError as exc:
        first_run_message(url, f"Cannot read the database: {exc}")
        return
    if runs.empty:
        first_run_message(url)
        return
    if not (runs["levels"] > 0).any():
        first_run_message(url, "Runs exist in this database but none has a finished concurrency level yet.")
        return
    PAGES[page](url, runs[runs["levels"] > 0])

main()
