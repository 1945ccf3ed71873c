"""Streamlit AppTest drives every dashboard page on a fixture database and checks what a user sees."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

import dashboard_fixture as fxdb  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
LAST = len(fxdb.COMMITS) - 1


@pytest.fixture(scope="module")
def fixture(tmp_path_factory) -> fxdb.Fixture:
    return fxdb.build(f"sqlite:///{tmp_path_factory.mktemp('dash') / 'fixture.db'}")


def open_page(url: str, page: str, monkeypatch) -> AppTest:
    monkeypatch.setenv("K2BENCH_DB", url)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["page"] = page
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _plain(value):
    """Plotly sends numeric arrays as typed base64 blobs; turn them back into lists."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def figures(at: AppTest) -> list[dict]:
    return [_plain(json.loads(el.proto.spec)) for el in at.get("plotly_chart")]


def traces(fig: dict, name_part: str) -> list[dict]:
    return [t for t in fig["data"] if name_part in t.get("name", "")]


TABLE_COLUMNS = {  # a column that only that page table has
    "frontier_table": "config", "history_table": "status", "compare_deltas": "tput_per_gpu Δ%",
    "compare_matched": "concurrency A", "detail_levels": "output_tput_per_gpu", "detail_split": "ttft_gap_ms",
}


def page_table(at: AppTest, name: str):
    """The page table identified by its distinctive column (AppTest exposes no key on dataframes)."""
    found = [d.value for d in at.dataframe if TABLE_COLUMNS[name] in d.value.columns]
    assert found, f"no {name} on the page"
    return found[0]


# ------------------------------------------------------------------ Frontier


def test_frontier_shows_each_configuration_with_concurrency_labels(fixture, monkeypatch):
    at = open_page(fixture.url, "Frontier", monkeypatch)
    assert at.title[0].value == "Frontier"
    (fig,) = figures(at)
    layout = fig["layout"]
    assert layout["title"]["text"] == "Throughput per GPU vs interactivity"
    assert layout["xaxis"]["title"]["text"] == "Interactivity (tok/s/user)"
    assert layout["yaxis"]["title"]["text"] == "Throughput (tok/s/GPU)"
    for engine in fxdb.ENGINES:
        (points,) = [t for t in fig["data"] if t["name"].startswith(engine) and t["mode"] == "markers+text"]
        assert points["text"] == [f"c{c}" for c in fxdb.LEVELS]
        # latest run of each configuration: the last commit on main (day 3)
        want_y = [fxdb.expected_tput(engine, c, LAST) for c in fxdb.LEVELS]
        want_x = [fxdb.expected_interactivity(engine, c, LAST) for c in fxdb.LEVELS]
        assert points["y"] == pytest.approx(want_y, rel=1e-9)
        assert points["x"] == pytest.approx(want_x, rel=1e-9)
        (line,) = [t for t in fig["data"] if t["name"].startswith(engine) and t["name"].endswith("frontier")]
        assert line["mode"] == "lines"
        assert sorted(line["x"]) == pytest.approx(sorted(want_x))  # every level is Pareto-optimal here


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> fxdb.Fixture:
    """The fixture plus one run at the published reference's model and workload (Kimi-K2.5, 8k/1k)."""
    fx = fxdb.build(f"sqlite:///{tmp_path_factory.mktemp('dash_ref') / 'published.db'}")
    fxdb.add_published_workload_run(fx.url)
    return fx


def test_frontier_overlays_published_reference_with_source(published, monkeypatch):
    at = open_page(published.url, "Frontier", monkeypatch)
    (fig,) = figures(at)
    (ref,) = traces(fig, "MI355X · ATOM")
    assert ref["x"] == [19.2] and ref["y"] == [5369.6] and ref["text"] == ["c128 (ref)"]
    assert any("116.4" in a.get("text", "") for a in fig["layout"]["annotations"])  # conc 4 gives x only
    assert any("Source:" in a.get("text", "") for a in fig["layout"]["annotations"])
    assert any("source: AMD" in c.value for c in at.caption)
    assert not any("hidden" in c.value for c in at.caption)
    at.checkbox(key="frontier_ref").uncheck().run()
    (fig,) = figures(at)
    assert not traces(fig, "MI355X · ATOM")


@pytest.fixture(scope="module")
def with_invalid(tmp_path_factory) -> fxdb.Fixture:
    """The fixture plus a newest vllm run whose level 32 is stored invalid."""
    fx = fxdb.build(f"sqlite:///{tmp_path_factory.mktemp('dash_invalid') / 'invalid.db'}")
    fxdb.add_run_with_invalid_level(fx.url, "vllm", 32)
    return fx


def test_frontier_shows_invalid_levels_greyed_with_their_reason_only_when_asked(with_invalid, monkeypatch):
    valid_levels = [c for c in fxdb.LEVELS if c != 32]
    want_x = [fxdb.expected_interactivity("vllm", c, LAST) for c in valid_levels]
    bad_x = 1000.0 / (2 * fxdb.gap_ms("vllm", 32, LAST))
    at = open_page(with_invalid.url, "Frontier", monkeypatch)
    assert not at.checkbox(key="frontier_invalid").value  # off by default
    (fig,) = figures(at)
    assert not traces(fig, "invalid")
    (points,) = [t for t in fig["data"] if t["name"].startswith("vllm") and t["mode"] == "markers+text"]
    assert points["text"] == [f"c{c}" for c in valid_levels]

    at.checkbox(key="frontier_invalid").check().run()
    assert not at.exception
    (fig,) = figures(at)
    (grey,) = traces(fig, "invalid")
    assert grey["mode"] == "markers+text"  # markers, never joined by a line
    assert grey["marker"]["color"] == "#9e9e9e" and grey["text"] == ["c32"]
    assert grey["x"] == pytest.approx([bad_x], rel=1e-9)
    assert fxdb.INVALID_REASON in grey["customdata"][0] and "concurrency 32" in grey["customdata"][0]
    # the valid levels and the frontier line are exactly as without the invalid one
    (points,) = [t for t in fig["data"] if t["name"].startswith("vllm") and t["mode"] == "markers+text"]
    assert points["x"] == pytest.approx(want_x, rel=1e-9)
    (line,) = [t for t in fig["data"] if t["name"].startswith("vllm") and t["name"].endswith("frontier")]
    assert bad_x not in line["x"] and sorted(line["x"]) == pytest.approx(sorted(want_x))
    table = page_table(at, "frontier_table")
    assert sorted(table.loc[table["config"].str.startswith("vllm"), "concurrency"]) == valid_levels
    assert any("1 invalid level(s)" in c.value for c in at.caption)
    for view in at.radio(key="frontier_view").options:  # every view, including those without a value there
        at.radio(key="frontier_view").set_value(view).run()
        assert not at.exception, (view, [e.value for e in at.exception])


def test_frontier_alternative_views(fixture, monkeypatch):
    at = open_page(fixture.url, "Frontier", monkeypatch)
    at.radio(key="frontier_view").set_value("Throughput vs E2E latency").run()
    (fig,) = figures(at)
    assert fig["layout"]["xaxis"]["title"]["text"] == "E2E latency median (ms)"
    assert fig["layout"]["yaxis"]["title"]["text"] == "Throughput (tok/s/GPU)"
    (points,) = [t for t in fig["data"] if t["name"].startswith("vllm") and t["mode"] == "markers+text"]
    want = [fxdb.ttft_ms(c) + (fxdb.OSL - 1) * fxdb.gap_ms("vllm", c, LAST) for c in fxdb.LEVELS]
    assert points["x"] == pytest.approx(want, rel=1e-9)
    # the caption promises lines joining the Pareto-optimal levels: more latency buys more throughput
    # at every level here, so every level is on the frontier and the line runs through all of them
    (line,) = [t for t in fig["data"] if t["name"].startswith("vllm") and t["name"].endswith("frontier")]
    assert sorted(line["x"]) == pytest.approx(sorted(want), rel=1e-9)
    at.radio(key="frontier_view").set_value("TTFT vs throughput").run()
    (fig,) = figures(at)
    assert fig["layout"]["xaxis"]["title"]["text"] == "Throughput (tok/s/GPU)"
    assert fig["layout"]["yaxis"]["title"]["text"] == "TTFT median (ms)"


def test_frontier_energy_and_cost_views(fixture, monkeypatch):
    at = open_page(fixture.url, "Frontier", monkeypatch)
    at.radio(key="frontier_view").set_value("Tokens per joule vs interactivity").run()
    (fig,) = figures(at)
    assert fig["layout"]["yaxis"]["title"]["text"] == "Tokens per joule"
    for engine in fxdb.ENGINES:
        (points,) = [t for t in fig["data"] if t["name"].startswith(engine) and t["mode"] == "markers+text"]
        want = [fxdb.expected_tput(engine, c, LAST) / fxdb.watts(engine, c) for c in fxdb.LEVELS]
        assert points["y"] == pytest.approx(want, rel=1e-6)
    at.radio(key="frontier_view").set_value("Cost vs interactivity").run()
    (fig,) = figures(at)
    assert fig["layout"]["yaxis"]["title"]["text"] == "Cost per million tokens ($/Mtok)"
    (points,) = [t for t in fig["data"] if t["name"].startswith("vllm") and t["mode"] == "markers+text"]
    want = [fxdb.PRICE / 3600 / fxdb.expected_tput("vllm", c, LAST) * 1e6 for c in fxdb.LEVELS]
    assert points["y"] == pytest.approx(want, rel=1e-9)
    table = page_table(at, "frontier_table")
    assert {"tokens_per_j", "usd_per_mtok"} <= set(table.columns)


def test_frontier_filters_and_csv(fixture, monkeypatch):
    at = open_page(fixture.url, "Frontier", monkeypatch)
    at.multiselect(key="filter_engine").select("vllm").run()
    (fig,) = figures(at)
    names = {t["name"] for t in fig["data"] if t["mode"] == "markers+text" and "MI355X" not in t["name"]}
    assert len(names) == 1 and next(iter(names)).startswith("vllm")
    at.multiselect(key="filter_branch").select("feature-x").run()
    table = page_table(at, "frontier_table")
    assert set(table["run_id"]) == {fixture.feature_run}
    assert set(table["branch"]) == {"feature-x"}
    labels = [b.label for b in at.get("download_button")]
    assert "Download frontier as CSV" in labels
    at.multiselect(key="filter_model").select("tiny-k2").run()
    at.multiselect(key="filter_branch").unselect("feature-x").select("main").run()
    at.multiselect(key="filter_engine").unselect("vllm").select("bundled").run()
    at.multiselect(key="filter_branch").unselect("main").run()
    at.multiselect(key="filter_engine").unselect("bundled").run()
    assert not at.warning
    # a date range before any run leaves nothing to draw, and says so
    at.date_input(key="filter_dates").set_value((fxdb.T0.date(), fxdb.T0.date())).run()
    assert len(page_table(at, "frontier_table")["run_id"].unique()) == 2  # day 0: one run per engine


def test_frontier_median_mode_pools_runs(fixture, monkeypatch):
    at = open_page(fixture.url, "Frontier", monkeypatch)
    at.multiselect(key="filter_branch").select("main").run()
    at.selectbox(key="frontier_mode").set_value("Median over runs in range").run()
    table = page_table(at, "frontier_table")
    row = table[(table["config"].str.startswith("bundled")) & (table["concurrency"] == 32)].iloc[0]
    tputs = sorted(fxdb.expected_tput("bundled", 32, i) for i in range(len(fxdb.COMMITS)))
    assert row["tput_per_gpu"] == pytest.approx((tputs[1] + tputs[2]) / 2, rel=1e-9)
    assert row["runs"] == len(fxdb.COMMITS)


# ------------------------------------------------------------------ History


def test_history_marks_the_regression(fixture, monkeypatch):
    at = open_page(fixture.url, "History", monkeypatch)
    at.selectbox(key="history_config").set_value(fixture.fingerprints["bundled"]).run()
    at.selectbox(key="history_conc").set_value("c32").run()
    at.selectbox(key="history_metric").set_value("tput_per_gpu").run()
    (fig,) = figures(at)
    assert fig["layout"]["yaxis"]["title"]["text"] == "Throughput (tok/s/GPU)"
    (series,) = traces(fig, "Throughput (tok/s/GPU)")
    want = [fxdb.expected_tput("bundled", 32, i) for i in range(len(fxdb.COMMITS))]
    assert series["y"] == pytest.approx(want, rel=1e-9)
    assert all("branch main" in h and "commit " in h and "UTC" in h for h in series["customdata"])
    assert fxdb.COMMITS[0][:10] in series["customdata"][0]
    (marker,) = traces(fig, "change point (regression)")
    assert marker["y"] == pytest.approx([want[-1]], rel=1e-9)
    rel = (want[-1] / want[0] - 1) * 100
    assert rel < 0
    (err,) = at.error
    assert "1 regression(s) flagged" in err.value and f"{rel:+.1f}%" in err.value
    # other levels have no change point recorded
    at.selectbox(key="history_conc").set_value("c4").run()
    assert not at.error
    assert not traces(figures(at)[0], "change point")


def test_history_marks_the_bisected_culprit_and_links_commits(fixture, monkeypatch):
    monkeypatch.setenv("K2BENCH_COMMIT_URL", "https://git.example/k2/commit/{commit}")
    at = open_page(fixture.url, "History", monkeypatch)
    at.selectbox(key="history_config").set_value(fixture.fingerprints["bundled"]).run()
    at.selectbox(key="history_conc").set_value("c32").run()
    at.selectbox(key="history_metric").set_value("tput_per_gpu").run()
    (fig,) = figures(at)
    (cross,) = traces(fig, "culprit (bisected)")
    assert cross["y"] == pytest.approx([fxdb.expected_tput("bundled", 32, LAST)], rel=1e-9)  # on the bad end
    assert fxdb.CULPRIT[:10] in cross["customdata"][0] and "scheduler: longer token gaps" in cross["customdata"][0]
    table = page_table(at, "history_table")
    assert list(table["commit"]) == [f"https://git.example/k2/commit/{c}" for c in fxdb.COMMITS]
    (culprits,) = [d.value for d in at.dataframe if "subject" in d.value.columns]
    assert list(culprits["first_bad"]) == [f"https://git.example/k2/commit/{fxdb.CULPRIT}"]
    assert list(culprits["bad"]) == [fxdb.COMMITS[-1]] and list(culprits["good"]) == [fxdb.COMMITS[-2]]
    # another metric or level has no culprit, and without a URL template commits stay plain
    at.selectbox(key="history_conc").set_value("c4").run()
    assert not traces(figures(at)[0], "culprit")
    monkeypatch.delenv("K2BENCH_COMMIT_URL")
    at = open_page(fixture.url, "History", monkeypatch)
    at.selectbox(key="history_config").set_value(fixture.fingerprints["bundled"]).run()
    assert list(page_table(at, "history_table")["commit"]) == fxdb.COMMITS


def test_history_commit_axis_and_latency_metric(fixture, monkeypatch):
    at = open_page(fixture.url, "History", monkeypatch)
    at.selectbox(key="history_config").set_value(fixture.fingerprints["vllm"]).run()
    at.selectbox(key="history_metric").set_value("tpot_ms_median").run()
    at.radio(key="history_x").set_value("commit order").run()
    (fig,) = figures(at)
    assert fig["layout"]["xaxis"]["title"]["text"] == "commit"
    assert fig["layout"]["xaxis"]["ticktext"][0] == fxdb.COMMITS[0][:7]
    table = page_table(at, "history_table")
    assert len(table) == len(fxdb.COMMITS) + 1  # main commits and the feature-branch run
    at.selectbox(key="history_branch").set_value("feature-x").run()
    table = page_table(at, "history_table")
    assert list(table["run_id"]) == [fixture.feature_run]


# ------------------------------------------------------------------ Compare


def test_compare_runs_shows_negative_deltas_for_the_regression(fixture, monkeypatch):
    at = open_page(fixture.url, "Compare", monkeypatch)
    at.selectbox(key="compare_run_a").set_value(fixture.runs[("bundled", LAST - 1)]).run()
    at.selectbox(key="compare_run_b").set_value(fixture.runs[("bundled", LAST)]).run()
    assert not at.warning  # same configuration
    (fig,) = figures(at)
    assert {t["name"] for t in fig["data"] if t["mode"] == "markers+text"} == {
        f"A: run #{fixture.runs[('bundled', LAST - 1)]}", f"B: run #{fixture.runs[('bundled', LAST)]}"}
    deltas = page_table(at, "compare_deltas")
    assert list(deltas["concurrency"]) == list(fxdb.LEVELS)
    want = [(fxdb.expected_tput("bundled", c, LAST) / fxdb.expected_tput("bundled", c, LAST - 1) - 1) * 100
            for c in fxdb.LEVELS]
    assert list(deltas["tput_per_gpu Δ%"]) == pytest.approx(want, rel=1e-9)
    assert (deltas["tput_per_gpu Δ%"] < 0).all()
    assert list(deltas["tpot_ms_median Δ%"]) == pytest.approx([(fxdb.REGRESSION_FACTOR - 1) * 100] * len(fxdb.LEVELS))
    peak = next(m for m in at.metric if m.label.startswith("Peak throughput"))
    assert peak.delta.startswith("-")
    matched = page_table(at, "compare_matched")
    assert len(matched) > 0 and (matched["Δ%"] < 0).all()
    shift = next(m for m in at.metric if m.label == "Throughput of B at matched interactivity")
    assert shift.delta.startswith("-")


def test_compare_reversed_runs_flip_the_sign(fixture, monkeypatch):
    at = open_page(fixture.url, "Compare", monkeypatch)
    at.selectbox(key="compare_run_a").set_value(fixture.runs[("bundled", LAST)]).run()
    at.selectbox(key="compare_run_b").set_value(fixture.runs[("bundled", LAST - 1)]).run()
    deltas = page_table(at, "compare_deltas")
    assert (deltas["tput_per_gpu Δ%"] > 0).all()
    assert next(m for m in at.metric if m.label.startswith("Peak throughput")).delta.startswith("+")


def test_compare_warns_about_unlike_configurations(fixture, monkeypatch):
    at = open_page(fixture.url, "Compare", monkeypatch)
    at.selectbox(key="compare_run_a").set_value(fixture.runs[("bundled", 0)]).run()
    at.selectbox(key="compare_run_b").set_value(fixture.runs[("vllm", 0)]).run()
    assert any("different configurations" in w.value for w in at.warning)


def test_compare_commits(fixture, monkeypatch):
    at = open_page(fixture.url, "Compare", monkeypatch)
    at.radio(key="compare_mode").set_value("Two commits").run()
    at.selectbox(key="compare_config").set_value(fixture.fingerprints["bundled"]).run()
    at.selectbox(key="compare_commit_a").set_value(fxdb.COMMITS[0]).run()
    at.selectbox(key="compare_commit_b").set_value(fxdb.COMMITS[LAST]).run()
    deltas = page_table(at, "compare_deltas")
    assert (deltas["tput_per_gpu Δ%"] < 0).all()
    assert list(deltas["interactivity_median Δ%"]) == pytest.approx([(1 / fxdb.REGRESSION_FACTOR - 1) * 100] * len(fxdb.LEVELS))
    (fig,) = figures(at)
    assert fig["layout"]["title"]["text"] == f"Frontiers: A: {fxdb.COMMITS[0][:10]} vs B: {fxdb.COMMITS[LAST][:10]}"


# ------------------------------------------------------------------ Run detail


def test_run_detail_metadata_levels_and_distributions(fixture, monkeypatch):
    run_id = fixture.runs[("vllm", 2)]
    at = open_page(fixture.url, "Run detail", monkeypatch)
    at.selectbox(key="detail_run").set_value(run_id).run()
    meta = pd.concat([t.value for t in at.table])
    assert meta.loc["commit", "value"] == fxdb.COMMITS[2]
    assert meta.loc["hardware", "value"] == fxdb.HARDWARE and meta.loc["engine", "value"] == "vllm"
    assert any('"max_num_seqs"' in j.proto.body for j in at.json)
    assert any("vllm serve tiny-k2" in c.value for c in at.code)
    levels = page_table(at, "detail_levels")
    assert list(levels["concurrency"]) == list(fxdb.LEVELS)
    assert list(levels["tput_per_gpu"]) == pytest.approx([fxdb.expected_tput("vllm", c, 2) for c in fxdb.LEVELS])
    at.selectbox(key="detail_conc").set_value(8).run()
    figs = {f["layout"]["title"]["text"]: f for f in figures(at)}
    ttft, itl, timeline = figs["TTFT distribution"], figs["Inter-token latency CDF"], figs["Request timeline"]
    assert ttft["layout"]["title"]["text"] == "TTFT distribution"
    assert ttft["data"][0]["x"] == pytest.approx([fxdb.ttft_ms(8)] * 16)
    assert itl["layout"]["title"]["text"] == "Inter-token latency CDF"
    gaps = itl["data"][0]["x"]
    assert len(gaps) == 16 * (fxdb.OSL - 1)
    assert gaps == pytest.approx([fxdb.gap_ms("vllm", 8, 2)] * len(gaps), abs=1e-5)  # ns rounding
    assert itl["data"][0]["y"][-1] == 1.0
    assert timeline["layout"]["title"]["text"] == "Request timeline"
    (bars,) = traces(timeline, "request (succeeded)")
    assert len([x for x in bars["x"] if x is not None]) == 2 * 16  # start and end of each request
    assert f"Download run_{run_id}_c8_requests as CSV" in [b.label for b in at.get("download_button")]


def test_run_detail_power_clock_and_server_timelines(fixture, monkeypatch):
    run_id = fixture.runs[("bundled", 1)]
    at = open_page(fixture.url, "Run detail", monkeypatch)
    at.selectbox(key="detail_run").set_value(run_id).run()
    figs = {f["layout"]["title"]["text"]: f for f in figures(at)}
    (gpu,) = figs["GPU power per GPU"]["data"]
    # levels end to end in concurrency order, each at its constant fixture power
    want = [w for c in fxdb.LEVELS for w in [fxdb.watts("bundled", c)] * _n(fixture, run_id, c) + [None]]
    assert gpu["y"] == pytest.approx(want)
    (clock,) = figs["SM clock per GPU"]["data"]
    assert {v for v in clock["y"] if v is not None} == {1900.0 - c for c in fxdb.LEVELS}
    (kv,) = figs["Server KV-cache usage"]["data"]
    assert {v for v in kv["y"] if v is not None} == {c / 64 for c in fxdb.LEVELS}
    assert [t["name"] for t in figs["Server queue"]["data"]] == ["k2bench_num_requests_running"]
    assert "Measured levels against the roofline" not in figs  # this run recorded no roofline
    levels = page_table(at, "detail_levels")
    tput = [fxdb.expected_tput("bundled", c, 1) for c in fxdb.LEVELS]
    assert list(levels["j_per_token"]) == pytest.approx([fxdb.watts("bundled", c) / t for c, t in zip(fxdb.LEVELS, tput, strict=True)])
    assert list(levels["usd_per_mtok"]) == pytest.approx([fxdb.PRICE / 3600 / t * 1e6 for t in tput])
    # what the server timed, beside the client's TTFT: the gap is the fixture's, the split its quarters
    split = page_table(at, "detail_split")
    assert list(split["concurrency"]) == list(fxdb.LEVELS)
    assert list(split["ttft_gap_ms"]) == pytest.approx([fxdb.SERVER_TTFT_GAP_MS] * len(fxdb.LEVELS))
    assert list(split["server_queue_ms_mean"]) == pytest.approx(
        [0.25 * (fxdb.ttft_ms(c) - fxdb.SERVER_TTFT_GAP_MS) for c in fxdb.LEVELS])


def _n(fixture, run_id: int, c: int) -> int:
    from k2bench.harness.store import Store

    with Store.open(fixture.url, readonly=True) as store:
        (p,) = [p for p in store.export_run(run_id)["points"] if p["concurrency"] == c]
    return len(p["energy"]["raw"]["t_s"])


def test_run_detail_roofline(fixture, monkeypatch):
    at = open_page(fixture.url, "Run detail", monkeypatch)
    at.selectbox(key="detail_run").set_value(fixture.feature_run).run()
    figs = {f["layout"]["title"]["text"]: f for f in figures(at)}
    fig = figs["Measured levels against the roofline"]
    (limit,) = traces(fig, "roofline (H200")
    (measured,) = traces(fig, "measured")
    assert sorted(limit["y"]) == pytest.approx(sorted(2 * fxdb.expected_tput("vllm", c, 1) for c in fxdb.LEVELS))
    assert measured["text"] == [f"c{c} (50%)" for c in fxdb.LEVELS]
    assert list(page_table(at, "detail_levels")["pct_roofline"]) == pytest.approx([50.0] * len(fxdb.LEVELS))


def test_run_detail_follows_the_run_query_parameter(fixture, monkeypatch):
    monkeypatch.setenv("K2BENCH_DB", fixture.url)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["page"] = "Run detail"
    at.query_params["run"] = str(fixture.feature_run)
    at.run()
    assert at.selectbox(key="detail_run").value == fixture.feature_run


# ------------------------------------------------------------------ empty and missing databases


def test_empty_database_shows_first_run_command(tmp_path, monkeypatch):
    from k2bench.harness.store import Store

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Store.open(url).close()
    for page in ("Frontier", "History", "Compare", "Run detail"):
        at = open_page(url, page, monkeypatch)
        assert not at.get("plotly_chart")
        assert "No benchmark runs in this database yet" in at.info[0].value
        # a first sweep that finishes in minutes here, then the design card's sweep for a GPU node
        codes = [c.value for c in at.code]
        assert codes[0] == f"k2bench sweep --isl 512 --osl 64 --conc 4..16 --db '{url}'"
        assert any(c.startswith("k2bench sweep --isl 8192 --osl 1024 --conc 4..128 --db") for c in codes[1:])
        assert any("on a GPU node" in m.value for m in at.markdown)


def test_missing_database_is_a_message_not_a_traceback(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'nowhere.db'}"
    at = open_page(url, "Frontier", monkeypatch)
    assert "Cannot read the database" in at.info[0].value
    assert not (tmp_path / "nowhere.db").exists()  # read-only: nothing was created


# ------------------------------------------------------------------ PostgreSQL


@pytest.fixture(scope="module")
def pg_fixture():
    """The same fixture in a private database of the test PostgreSQL (created here, dropped after)."""
    from conftest import private_pg_database

    with private_pg_database("k2bench_dash") as url:
        try:
            yield fxdb.build(url)
        finally:
            from k2bench.dashboard import cache

            cache.store.clear()  # the cached read-only engine holds connections to the database


@pytest.mark.postgres
def test_pages_on_postgresql(pg_fixture, monkeypatch):
    at = open_page(pg_fixture.url, "Frontier", monkeypatch)
    (fig,) = figures(at)
    (points,) = [t for t in fig["data"] if t["name"].startswith("bundled") and t["mode"] == "markers+text"]
    assert points["y"] == pytest.approx([fxdb.expected_tput("bundled", c, LAST) for c in fxdb.LEVELS], rel=1e-9)

    at = open_page(pg_fixture.url, "History", monkeypatch)
    at.selectbox(key="history_config").set_value(pg_fixture.fingerprints["bundled"]).run()
    at.selectbox(key="history_conc").set_value("c32").run()
    assert traces(figures(at)[0], "change point (regression)")

    at = open_page(pg_fixture.url, "Compare", monkeypatch)
    at.selectbox(key="compare_run_a").set_value(pg_fixture.runs[("bundled", LAST - 1)]).run()
    at.selectbox(key="compare_run_b").set_value(pg_fixture.runs[("bundled", LAST)]).run()
    assert (page_table(at, "compare_deltas")["tput_per_gpu Δ%"] < 0).all()

    at = open_page(pg_fixture.url, "Run detail", monkeypatch)
    titles = [f["layout"]["title"]["text"] for f in figures(at)]  # telemetry timelines come first
    assert titles[-3:] == ["TTFT distribution", "Inter-token latency CDF", "Request timeline"]
