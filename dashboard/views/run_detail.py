"""Run detail page: metadata, per-level table and per-request distributions of one run."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from k2bench.dashboard import cache, charts, data, steady_charts, telemetry_charts
from k2bench.dashboard.views import run_workload
from k2bench.dashboard.views.common import csv_download, run_param_problem, slo_input, table_columns
from k2bench.harness.analysis.mdsafe import md_text


def render(url: str, runs: pd.DataFrame) -> None:
    st.title("Run detail")
    runs = data.runs_table(runs)
    labels = {int(r["run_id"]): data.run_label(r) for r in runs.to_dict("records")}
    ids = list(labels)
    wanted = st.query_params.get("run")
    problem = run_param_problem(wanted, cache.runs(url)) if wanted else None
    index = None if problem else ids.index(int(wanted)) if wanted else 0
    run_id = st.selectbox("Run", ids, index=index, format_func=labels.get, key="detail_run")
    if run_id is None:
        st.error(problem)
        return
    st.query_params["run"] = str(run_id)
    meta = cache.run(url, run_id)

    st.subheader("Metadata")
    rows = [(k, str(meta.get(k))) for k in data.META_FIELDS if meta.get(k) not in (None, "")]
    half = (len(rows) + 1) // 2
    left, right = st.columns(2)
    for col, part in ((left, rows[:half]), (right, rows[half:])):
        col.table(pd.DataFrame(part, columns=["field", "value"]).set_index("field"))
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**Engine flags**")
        st.json(meta.get("engine_flags") or {})
    with c2:
        if meta.get("server_command"):
            st.markdown("**Server command**")
            cmd = meta["server_command"]
            st.code(" ".join(cmd) if isinstance(cmd, list) else str(cmd), language="bash")
        if meta.get("tags"):
            st.markdown("**Tags**")
            st.json(meta["tags"])

    st.subheader("Per-level results")
    slo = slo_input(st, runs[runs["run_id"] == run_id], "detail_slo")
    levels = data.per_run_levels(cache.points_under_slo(url, (int(run_id),), slo.text, include_invalid=True) if slo
                                 else cache.points(url, (int(run_id),), include_invalid=True))
    table = data.level_table(levels)
    st.dataframe(table, hide_index=True, column_config=table_columns(table), key="detail_levels")
    csv_download(table, f"run_{run_id}_levels", key="detail_levels_csv")
    split = data.split_table(levels)
    if split is not None:
        st.subheader("At the server")
        st.caption("From the server's own histograms over each level's measured window: server TTFT = queue + "
                   "prefill (means); the client's TTFT minus it is the way to the server and back, and the client. "
                   "p50/p99 are read within a histogram bucket and are off by at most its width.")
        st.dataframe(split, hide_index=True, column_config=table_columns(split), key="detail_split")

    evals = cache.evals(url, (int(run_id),)).get(int(run_id), [])
    if evals:
        st.subheader("Accuracy")
        badge = data.accuracy_badges({int(run_id): evals}, {int(run_id): str(meta.get("model") or "")})
        st.caption(md_text(badge[int(run_id)], None))  # task names are stored text: inert in markdown
        st.dataframe(pd.DataFrame([{k: e[k] for k in ("task", "metric", "value", "stderr", "n", "concurrency")}
                                   for e in evals]), hide_index=True, key="detail_evals")

    _telemetry(url, run_id, meta)

    st.subheader("Per-request distributions")
    concs = [int(c) for c in table["concurrency"]]
    conc = st.selectbox("Concurrency", concs, index=len(concs) - 1, key="detail_conc")
    for point in (p for p in cache.levels(url, run_id) if p.get("concurrency") == conc):
        fig = steady_charts.slices_figure(point)
        if fig is not None:
            st.plotly_chart(fig, key=f"detail_slices_{point.get('trial') or 0}")
    reqs = cache.requests(url, run_id, conc)
    if reqs.empty:
        st.info("No per-request records are stored for this level (for example, a run imported without them).")
        return
    run_workload.render(meta, cache.levels(url, run_id), reqs)
    c1, c2 = st.columns(2)
    c1.plotly_chart(charts.ttft_histogram(reqs), key="detail_ttft")
    c2.plotly_chart(charts.itl_cdf(cache.itl(url, run_id, conc)), key="detail_itl")
    st.plotly_chart(charts.request_timeline(reqs), key="detail_timeline")
    failed = int((~reqs["success"].astype(bool)).sum())
    st.caption(f"{len(reqs)} measured request(s) at concurrency {conc}, {failed} failed.")
    csv_download(reqs, f"run_{run_id}_c{conc}_requests", key="detail_requests_csv")


def _telemetry(url: str, run_id: int, meta: dict) -> None:
    """Power and clocks per GPU, the server's KV usage and queue, and the roofline, where recorded."""
    st.subheader("Power, clocks and the server")
    points = cache.levels(url, run_id)
    tel = (meta.get("extra") or {}).get("telemetry") or {}
    for note in (tel.get("notes") or {}).values():
        st.caption(md_text(note, None))
    figs = [("power", telemetry_charts.gpu_timeline(points, "power_w")),
            ("clock", telemetry_charts.gpu_timeline(points, "sm_clock_mhz")),
            ("kv", telemetry_charts.server_timeline(points, "kv")),
            ("queue", telemetry_charts.server_timeline(points, "queue"))]
    shown = [(k, f) for k, f in figs if f is not None]
    if not shown:
        st.info("This run recorded neither GPU samples nor the server's metrics.")
    for i in range(0, len(shown), 2):
        cols = st.columns(2)
        for col, (key, fig) in zip(cols, shown[i:i + 2], strict=False):
            col.plotly_chart(fig, key=f"detail_{key}")
    invalid = [f"c{p['concurrency']}: {p['energy']['reason']}" for p in points
               if p.get("energy") and not p["energy"].get("power_valid")]
    if invalid:
        st.warning("Energy not valid at " + "; ".join(invalid))
    roof = (meta.get("extra") or {}).get("roofline")
    if roof:
        st.plotly_chart(telemetry_charts.roofline_figure(points, roof), key="detail_roofline")
