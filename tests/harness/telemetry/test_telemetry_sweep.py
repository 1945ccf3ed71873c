"""Telemetry through a whole sweep: the bundled engine's own counters over each measured window equal
the measured requests' tokens exactly (warmup excluded), energy is null with its reason on a machine
without GPU telemetry, and a given price becomes $/Mtok; a server without /metrics is noted once."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from k2bench.harness.cli import main
from k2bench.harness.store import Store

ISL, OSL, MEASURED, WARMUP = 32, 8, 6, 3


def _no_gpu_library(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)


@pytest.mark.engine
@pytest.mark.slow
def test_a_bundled_engine_sweep_stores_the_servers_counters_energy_note_and_cost(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    _no_gpu_library(monkeypatch)
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path}/k.db"
    code = main(["sweep", "--isl", str(ISL), "--osl", str(OSL), "--conc", "2,4", "--num-prompts", str(MEASURED),
                 "--warmup", str(WARMUP), "--gpu-hour-usd", "2.5", "--eval", "none", "--db", db, "--json", "run.json"])
    err = capsys.readouterr().err
    assert code == 0, err
    doc = json.loads((tmp_path / "run.json").read_text())
    notes = doc["run"]["extra"]["telemetry"]["notes"]
    assert notes["gpu"].startswith("GPU telemetry off:") and "server_metrics" not in notes
    assert doc["run"]["extra"]["telemetry"]["gpu_hour_usd"] == 2.5
    assert notes["roofline"].startswith("roofline off:")  # a CPU is not in the hardware table
    assert [p["concurrency"] for p in doc["points"]] == [2, 4]
    for p in doc["points"]:
        counters = p["server_metrics"]["counters"]
        # the window opens after warmup and closes after the last measured request: exact totals
        assert counters["k2bench_prompt_tokens_total"] == ISL * MEASURED
        assert counters["k2bench_generation_tokens_total"] == OSL * MEASURED
        assert counters["k2bench_request_success_total"] == MEASURED
        assert counters["k2bench_time_to_first_token_seconds_count"] == MEASURED
        assert counters["k2bench_inter_token_latency_seconds_count"] == (OSL - 1) * MEASURED
        # the engine's phase histograms hold exactly the measured requests; its TTFT (queue + prefill,
        # from the moment the handler made the request) lies inside the client's
        split = p["server_metrics"]["split"]
        assert [split[phase]["count"] for phase in ("queue", "prefill", "decode", "inference")] == [MEASURED] * 4
        assert 0 < p["server_ttft_ms"] < p["ttft_ms"]["mean"]
        assert p["server_inference_ms"]["mean"] == pytest.approx(
            p["server_prefill_ms"]["mean"] + p["server_decode_ms"]["mean"], rel=1e-3)
        # gauges are sampled once a second: a level this short may see only its idle ends
        kv = p["server_metrics"]["gauges"]["k2bench_kv_cache_usage_perc"]
        assert 0 <= kv["mean"] <= kv["max"] <= 1 and p["server_metrics"]["scrapes"] >= 2
        assert p["energy"] is None and p["j_per_token"] is None
        expected = 2.5 / 3600 / p["tput_per_gpu"] * 1e6
        assert p["cost"]["usd_per_mtok"] == pytest.approx(expected) and p["usd_per_mtok"] == pytest.approx(expected)
        assert p["cost"]["usd_per_mtok_output"] == pytest.approx(2.5 / 3600 / p["output_tput_per_gpu"] * 1e6)
    with Store.open(db, readonly=True) as store:
        frame = store.points_frame()
        assert list(frame["usd_per_mtok"]) == pytest.approx([p["usd_per_mtok"] for p in doc["points"]])
    shutil.rmtree(tmp_path / "results", ignore_errors=True)


def test_a_server_without_metrics_is_noted_once_and_levels_keep_null(tmp_path, monkeypatch, capsys):
    _no_gpu_library(monkeypatch)
    monkeypatch.chdir(tmp_path)
    code = main(["sweep", "--engine", "testserver", "--server-args", "--ttft-ms 5 --itl-ms 1", "--isl", "16",
                 "--osl", "4", "--conc", "1,2", "--num-prompts", "2", "--warmup", "0",
                 "--db", f"sqlite:///{tmp_path}/k.db", "--json", "run.json", "--hardware", "NVIDIA H200"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("server metrics off:") == 1 and "HTTP 404" in err
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["run"]["extra"]["telemetry"]["notes"]["server_metrics"].startswith("server metrics off:")
    for p in doc["points"]:
        assert p["server_metrics"] is None
        # no --gpu-hour-usd: the shipped table's H200 price, with its source
        assert p["cost"]["gpu_hour_usd"] == 3.5 and "nebius" in p["cost"]["price_source"].lower()


def test_bad_telemetry_flags_are_one_line_errors(tmp_path, capsys):
    for flags, message in ((["--gpu-ids", "0,,1"], "--gpu-ids"), (["--gpu-hour-usd", "-1"], "--gpu-hour-usd")):
        code = main(["sweep", "--engine", "testserver", "--conc", "1", *flags, "--db", f"sqlite:///{tmp_path}/k.db"])
        err = capsys.readouterr().err
        assert code != 0 and message in err and "Traceback" not in err
