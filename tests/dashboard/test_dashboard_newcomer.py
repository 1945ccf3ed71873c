"""What a newcomer meets first (issue 16): a frontier that shows their own points with readable labels
and no unrelated published marks, a run id in the address that does not exist, a history axis that
does not turn noise into a cliff, and hints that are true."""

from __future__ import annotations

import dashboard_fixture as fxdb
import pandas as pd
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402
from test_dashboard_pages import APP, LAST, figures, open_page, page_table, traces  # noqa: E402

from k2bench.dashboard.labels import short_hardware, short_labels  # noqa: E402
from k2bench.dashboard.reference import load_reference, matching, same_model  # noqa: E402


@pytest.fixture(scope="module")
def fixture(tmp_path_factory) -> fxdb.Fixture:
    return fxdb.build(f"sqlite:///{tmp_path_factory.mktemp('newcomer') / 'fixture.db'}")


# ------------------------------------------------------------------ Frontier: reference marks and axes


def test_reference_for_another_model_and_workload_is_hidden_with_a_note(fixture, monkeypatch):
    at = open_page(fixture.url, "Frontier", monkeypatch)
    (fig,) = figures(at)
    # only the user's two configurations (points and frontier lines): no star, no guide line
    assert {t["name"].removesuffix(" frontier") for t in fig["data"]} == {"bundled 1.0", "vllm 1.0"}
    assert not fig["layout"].get("shapes")
    assert not any("116.4" in a.get("text", "") for a in fig["layout"].get("annotations", []))
    (note,) = [c.value for c in at.caption if "hidden" in c.value]
    assert "Kimi-K2.5" in note and "ISL 8192 / OSL 1024" in note
    # the axes are Plotly's fit to the drawn data, and the drawn data is the user's alone
    assert "range" not in fig["layout"].get("yaxis", {}) and "range" not in fig["layout"].get("xaxis", {})
    top = max(fxdb.expected_tput(e, c, LAST) for e in fxdb.ENGINES for c in fxdb.LEVELS)
    assert max(max(t["y"]) for t in fig["data"]) == pytest.approx(top)


def test_reference_matches_model_by_name_and_workload_by_lengths():
    ref = load_reference()
    assert set(ref["name"]) and (ref["isl"] == 8192).all() and (ref["osl"] == 1024).all()

    def pts(model, isl, osl):
        return pd.DataFrame([{"model": model, "isl": isl, "osl": osl}])

    assert len(matching(ref, pts("amd/Kimi-K2.5-MXFP4", 8192, 1024))[0]) == len(ref)
    for other in (pts("amd/Kimi-K2.5-MXFP4", 1024, 1024), pts("tiny-k2", 8192, 1024),
                  pts("results/models/tiny-mxfp4", 512, 64)):
        shown, notes = matching(ref, other)
        assert shown.empty and len(notes) == ref["name"].nunique()
    assert same_model("Kimi-K2.5", "Kimi-K2.5") and same_model("moonshotai/kimi-k2.5", "Kimi-K2.5")
    assert not same_model("Kimi-K2.55", "Kimi-K2.5") and not same_model("Kimi-K2", "Kimi-K2.5")


# ------------------------------------------------------------------ Frontier: labels


def test_legend_and_table_name_configurations_by_what_differs(fixture, monkeypatch):
    at = open_page(fixture.url, "Frontier", monkeypatch)
    (fig,) = figures(at)
    names = [t["name"] for t in fig["data"] if t["mode"] == "markers+text"]
    assert sorted(names) == ["bundled 1.0", "vllm 1.0"]
    # what both share is said once, with the CPU name shortened, not repeated in every legend entry
    (summary,) = [c.value for c in at.caption if "configuration(s)" in c.value]
    assert "All of them: fixture · tiny-k2 · mxfp4 · Intel Xeon Platinum 8480C · TP1." in summary
    table = page_table(at, "frontier_table")
    assert set(table["config"]) == {"bundled 1.0", "vllm 1.0"}


def test_labels_put_the_differing_field_first_and_never_shorten_it_away():
    xeon = "Intel(R) Xeon(R) Platinum 8480C Processor @ 2.00GHz"
    assert short_hardware(xeon) == "Intel Xeon Platinum 8480C"
    assert short_hardware("AMD EPYC 9654 96-Core Processor") == "AMD EPYC 9654"
    assert short_hardware("AMD Instinct MI355X") == "AMD Instinct MI355X"
    base = {"engine": "bundled", "engine_version": "0.1", "model": "results/models/tiny-mxfp4",
            "precision": "mxfp4", "hardware": xeon, "num_gpus": 1, "tp": 1}
    two_workloads = pd.DataFrame([{**base, "workload": w, "config": w, "fingerprint": w}
                                  for w in ("isl512-osl64", "isl8192-osl1024")])
    labels, shared = short_labels(two_workloads)
    assert labels == {"isl512-osl64": "isl512-osl64", "isl8192-osl1024": "isl8192-osl1024"}
    assert shared == "bundled 0.1 · tiny-mxfp4 · mxfp4 · Intel Xeon Platinum 8480C · TP1"
    # two machines whose names differ only in the part the shortening drops: keep the full names
    clocks = pd.DataFrame([{**base, "workload": "w", "hardware": xeon.replace("2.00", ghz), "config": ghz}
                           for ghz in ("2.00", "2.40")])
    labels, _ = short_labels(clocks)
    assert labels == {"2.00": xeon, "2.40": xeon.replace("2.00", "2.40")}
    # same model name under two owners: the owner stays
    owners = pd.DataFrame([{**base, "workload": "w", "model": f"{o}/Kimi-K2.5", "config": o} for o in ("a", "b")])
    assert short_labels(owners)[0] == {"a": "a/Kimi-K2.5", "b": "b/Kimi-K2.5"}
    # nothing visible differs (say, engine flags): the fingerprint keeps them apart
    flags = pd.DataFrame([{**base, "workload": "w", "config": fp, "fingerprint": fp} for fp in ("abcdef12", "123456ab")])
    labels, shared = short_labels(flags)
    assert labels["abcdef12"].endswith("[abcdef]") and labels["123456ab"].endswith("[123456]")
    assert labels["abcdef12"].startswith("bundled 0.1 · w · tiny-mxfp4") and shared == ""
    # several GPUs are named with the hardware
    gpus = pd.DataFrame([{**base, "workload": "w", "hardware": "MI355X", "num_gpus": n, "tp": n, "config": str(n)}
                         for n in (1, 4)])
    assert short_labels(gpus)[0] == {"1": "MI355X · TP1", "4": "MI355X ×4 · TP4"}


# ------------------------------------------------------------------ Run detail: the run in the address


@pytest.mark.parametrize("which", ["unknown", "unfinished", "not a number"])
def test_run_detail_says_when_the_run_in_the_address_cannot_be_shown(fixture, monkeypatch, which):
    wanted = {"unknown": "999", "unfinished": str(fixture.unfinished_run), "not a number": "seven"}[which]
    monkeypatch.setenv("K2BENCH_DB", fixture.url)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["page"] = "Run detail"
    at.query_params["run"] = wanted
    at.run()
    assert not at.exception
    (err,) = at.error
    expected = {"unknown": "There is no run 999 in this database",
                "unfinished": f"Run {wanted} (partial) has no finished concurrency level",
                "not a number": "is not a run id"}[which]
    assert expected in err.value
    # nothing of another run is shown in its place
    assert at.selectbox(key="detail_run").value is None
    assert not at.get("plotly_chart") and not at.table
    # picking a run from the list shows it
    at.selectbox(key="detail_run").set_value(fixture.feature_run).run()
    assert not at.error
    titles = [f["layout"]["title"]["text"] for f in figures(at)]
    # its request distributions, beside its power/server timelines and roofline (docs/telemetry.md)
    assert {"TTFT distribution", "Inter-token latency CDF", "Request timeline"} <= set(titles)
    assert "Measured levels against the roofline" in titles
    assert pd.concat([t.value for t in at.table]).loc["branch", "value"] == "feature-x"


# ------------------------------------------------------------------ History: axis and hints


def _history(fixture, monkeypatch, engine: str, conc: int) -> AppTest:
    at = open_page(fixture.url, "History", monkeypatch)
    at.selectbox(key="history_config").set_value(fixture.fingerprints[engine]).run()
    at.selectbox(key="history_conc").set_value(f"c{conc}").run()
    at.selectbox(key="history_metric").set_value("tput_per_gpu").run()
    return at


def test_history_axis_starts_at_zero_or_reads_in_percent(fixture, monkeypatch):
    at = _history(fixture, monkeypatch, "bundled", 32)
    (fig,) = figures(at)
    assert fig["layout"]["yaxis"]["rangemode"] == "tozero"  # the default: a 20% drop looks like 20%
    want = [fxdb.expected_tput("bundled", 32, i) for i in range(len(fxdb.COMMITS))]
    at.radio(key="history_y").set_value("% of median").run()
    (fig,) = figures(at)
    assert fig["layout"]["yaxis"]["title"]["text"] == "Throughput (tok/s/GPU), % of median"
    median = float(pd.Series(want).median())
    (series,) = traces(fig, "Throughput (tok/s/GPU)")
    assert series["y"] == pytest.approx([w / median * 100 for w in want], rel=1e-9)
    assert f"{want[0]:.4g}" in series["customdata"][0]  # hover keeps the measured value
    (marker,) = traces(fig, "change point (regression)")
    assert marker["y"] == pytest.approx([want[-1] / median * 100], rel=1e-9)
    at.radio(key="history_y").set_value("fitted to the data").run()
    assert "rangemode" not in figures(at)[0]["layout"].get("yaxis", {})


def test_history_hints_say_what_is_true(fixture, monkeypatch):
    # the bundled configuration was scanned (a change point at concurrency 32): no "run the scan" at 4
    at = _history(fixture, monkeypatch, "bundled", 4)
    captions = [c.value for c in at.caption]
    assert not any("run `k2bench changepoints`" in c for c in captions)
    assert any("No change point recorded for Throughput (tok/s/GPU) at concurrency 4; the scan found changes "
               "only elsewhere" in c for c in captions)
    # vllm has 5 runs (4 on main, 1 on a branch): too few for a scan, and it says how many are needed
    at = _history(fixture, monkeypatch, "vllm", 4)
    assert any("needs at least 6 runs of a configuration and this series has 5" in c.value for c in at.caption)


def test_configuration_pickers_lead_with_what_differs(fixture, monkeypatch):
    at = open_page(fixture.url, "History", monkeypatch)
    shared = "fixture · tiny-k2 · mxfp4 · Intel Xeon Platinum 8480C · TP1"
    # the newest configuration first (bundled ran an hour after vllm on each day)
    assert at.selectbox(key="history_config").options == [f"bundled 1.0 · {shared}", f"vllm 1.0 · {shared}"]


# ------------------------------------------------------------------ tables: the catalogue's words and decimals


def _shown_headers(df_element) -> dict[str, str]:
    """column -> the header the page shows (its column setting's label, else the raw name)."""
    import json

    settings = json.loads(df_element.proto.columns or "{}")
    return {c: settings.get(c, {}).get("label", c) for c in df_element.value.columns}


def test_every_table_uses_the_catalogue_headers_units_and_decimals(fixture, monkeypatch):
    import json

    from k2bench.harness.measure.catalogue import BY_COLUMN

    # tables on each page (History: culprits too; Run detail: what the server timed too)
    pages = {"Frontier": 1, "History": 3, "Compare": 2, "Run detail": 2}
    seen = set()
    for page, n_tables in pages.items():
        at = open_page(fixture.url, page, monkeypatch)
        if page == "History":  # the regressed series, so the change-point table is there too
            at = _history(fixture, monkeypatch, "bundled", 32)
        tables = list(at.dataframe)
        assert len(tables) == n_tables, page
        for d in tables:
            headers = _shown_headers(d)
            settings = json.loads(d.proto.columns)
            # no raw field name (tput_per_gpu, interactivity_median, run_id) is shown as a header
            assert not [h for h in headers.values() if "_" in h], (page, headers)
            for col in d.value.columns:
                base = col.removesuffix(" A").removesuffix(" B")
                if base in BY_COLUMN:
                    m = BY_COLUMN[base]
                    assert headers[col].startswith(m.header), (col, headers[col])
                    assert settings[col]["type_config"]["format"] == f"%.{m.decimals}f"
                    seen.add(base)
                if col.endswith("Δ%"):
                    assert settings[col]["type_config"]["format"] == "%+.1f%%"
    assert {"tput_per_gpu", "interactivity_median", "ttft_ms_median", "tpot_ms_median"} <= seen
    assert BY_COLUMN["tput_per_gpu"].header == "tok/s/GPU"  # what the frontier table shows for tput_per_gpu
