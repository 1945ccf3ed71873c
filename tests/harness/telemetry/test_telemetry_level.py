"""A level's telemetry: the load generator's window opens after warmup and closes after the last
measured request; LevelTelemetry turns one window into `energy`, `cost` and `server_metrics`, and
says once why a source is off."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest
from conftest import free_port
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from telemetry_fakes import FakeSource

from k2bench.errors import UserError
from k2bench.harness.load.loadgen import LevelSpec, Prompt, run_level
from k2bench.harness.servers import launch
from k2bench.harness.telemetry.level import LevelTelemetry, TelemetryConfig


def test_the_window_opens_after_warmup_and_closes_after_the_last_measured_request(tmp_path):
    done = {"warm": 0, "measured": 0}
    seen: list[tuple[str, dict]] = []

    def finished(rec) -> None:
        done["warm" if rec.warmup else "measured"] += 1

    window = (lambda: seen.append(("start", dict(done))), lambda: seen.append(("end", dict(done))))
    prompts = [Prompt(input_len=8, output_len=4, token_ids=[100 + i + j for j in range(8)]) for i in range(3)]
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=["--ttft-ms=5", "--itl-ms=1"],
                            log_dir=tmp_path) as server:
        spec = LevelSpec(base_url=server.base_url, model="k2bench-test", concurrency=2, num_prompts=5, num_warmup=3,
                         timeout_s=60)
        asyncio.run(run_level(spec, prompts, finished, on_window=window))
    assert seen == [("start", {"warm": 3, "measured": 0}), ("end", {"warm": 3, "measured": 5})]


@contextlib.contextmanager
def prometheus():
    reg = CollectorRegistry()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        yield reg, f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        thread.join()


def test_one_window_gives_energy_cost_and_the_servers_counters():
    src = FakeSource(n=2, reads_wanted=5)
    notes: list[str] = []
    with prometheus() as (reg, url):
        prompt = Counter("k2bench_prompt_tokens", "p", registry=reg)
        running = Gauge("k2bench_num_requests_running", "r", registry=reg)
        prompt.inc(111)
        tel = LevelTelemetry(TelemetryConfig(gpu_hour_usd=3.6, gpu_hz=200.0), base_url=url, server_env={},
                             hardware="NVIDIA H200", say=notes.append, source=src)
        tel.begin()
        prompt.inc(8 * 40)
        running.set(4)
        assert src.enough.wait(60)
        tel.end()
        tel.abort()  # after a normal end: keeps the window's results
    point = {"input_tokens": 320, "output_tokens": 80, "tput_per_gpu": 1000.0, "output_tput_per_gpu": 200.0}
    f = tel.fields(point)
    tel.close()
    assert src.closed
    assert f["server_metrics"]["counters"]["k2bench_prompt_tokens_total"] == 320
    assert f["server_metrics"]["gauges"]["k2bench_num_requests_running"]["max"] == 4
    n = len(f["energy"]["raw"]["t_s"])
    assert f["energy"]["energy_j"] == pytest.approx(2 * 7.0 * (n - 1))  # two GPUs' counters
    assert f["energy"]["j_per_token"] == pytest.approx(f["energy"]["energy_j"] / 400)
    assert f["cost"]["usd_per_mtok"] == pytest.approx(1.0) and f["cost"]["usd_per_mtok_output"] == pytest.approx(5.0)
    # the flat figures the catalogue follows are the nested ones (energy only when power_valid)
    assert f["energy"]["power_valid"] is True
    assert (f["j_per_token"], f["tokens_per_j"]) == (f["energy"]["j_per_token"], f["energy"]["tokens_per_j"])
    assert (f["usd_per_mtok"], f["usd_per_mtok_output"]) == (pytest.approx(1.0), pytest.approx(5.0))
    assert f["pct_roofline"] is None  # no roofline given
    meta = tel.run_meta()
    assert meta["gpus"] == [{"id": "0", "name": "Fake"}, {"id": "1", "name": "Fake"}]
    assert meta["gpu_hour_usd"] == 3.6 and meta["notes"] == {}


def test_sources_that_are_off_give_null_fields_and_one_note_each(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    notes: list[str] = []
    tel = LevelTelemetry(TelemetryConfig(), base_url=f"http://127.0.0.1:{free_port()}", server_env={},
                         hardware="cpu: Some CPU", say=notes.append)
    for _ in range(3):  # three levels
        tel.begin()
        tel.end()
        f = tel.fields({"input_tokens": 10, "output_tokens": 10, "tput_per_gpu": 5.0, "output_tput_per_gpu": 2.5})
        assert set(f) == {"energy", "cost", "server_metrics", "j_per_token", "tokens_per_j", "usd_per_mtok",
                          "usd_per_mtok_output", "pct_roofline", "server_ttft_ms", "server_queue_ms",
                          "server_prefill_ms", "server_decode_ms", "server_inference_ms", "spec_accept_len",
                          "spec_accept_rate"}
        assert all(v is None for v in f.values())
    tel.close()
    assert len(notes) == 3, notes  # GPU, price, /metrics: once each, not per level
    assert set(tel.run_meta()["notes"]) == {"gpu", "cost", "server_metrics"}
    assert tel.run_meta()["notes"]["gpu"].startswith("GPU telemetry off:")
    assert "--gpu-hour-usd" in tel.run_meta()["notes"]["cost"]


def test_no_telemetry_and_an_aborted_window():
    tel = LevelTelemetry(TelemetryConfig(gpu=False, server_metrics=False), base_url="http://h:1", server_env={},
                         hardware="NVIDIA H100 80GB HBM3")
    assert tel.run_meta()["notes"]["gpu"] == "GPU telemetry off: --no-telemetry"
    assert tel.price == 2.99  # the table's H100 entry still prices the run
    src = FakeSource(n=1)
    tel = LevelTelemetry(TelemetryConfig(server_metrics=False), base_url="http://h:1", server_env={}, hardware=None,
                         source=src)
    tel.begin()
    tel.abort()
    assert not tel.sampler.is_open
    assert tel.fields({"tput_per_gpu": 1.0})["energy"] is None
    tel.abort()  # nothing open: harmless
    tel.close()


@pytest.mark.parametrize(("field", "value", "message"), [("gpu_ids", "0,,1", "--gpu-ids"),
                                                         ("gpu_hour_usd", -2.0, "--gpu-hour-usd")])
def test_bad_settings_are_user_errors(field, value, message):
    with pytest.raises(UserError, match=message):
        TelemetryConfig(**{field: value}).validate()


def test_an_invalid_power_window_keeps_its_numbers_nested_but_not_flat():
    src = FakeSource(n=2, fail_at=2, reads_wanted=5)  # GPU 1 misses its second reading
    roof = {"points": [{"concurrency": 8, "tput_per_gpu": 4000.0, "interactivity": 50.0}]}
    tel = LevelTelemetry(TelemetryConfig(server_metrics=False, gpu_hz=200.0), base_url="http://127.0.0.1:1",
                         server_env={}, hardware=None, source=src, roof=roof)
    tel.begin()
    assert src.enough.wait(60)
    tel.end()
    f = tel.fields({"concurrency": 8, "input_tokens": 80, "output_tokens": 20, "tput_per_gpu": 1000.0,
                    "interactivity": {"median": 10.0}})
    tel.close()
    assert f["energy"]["power_valid"] is False and "GPU 1 missing" in f["energy"]["reason"]
    assert f["energy"]["j_per_token"] is not None
    assert f["j_per_token"] is None and f["tokens_per_j"] is None
    assert f["pct_roofline"] == pytest.approx(25.0)


def test_a_remote_server_turns_gpu_reading_off_unless_ids_are_given():
    from k2bench.harness.telemetry.level import is_local

    assert is_local("http://127.0.0.1:8000") and is_local("localhost:9") and not is_local("http://192.0.2.7:8000")
    tel = LevelTelemetry(TelemetryConfig(server_metrics=False), base_url="http://192.0.2.7:8000", server_env={},
                         hardware=None)
    assert "not on this machine" in tel.notes["gpu"] and tel.sampler is None
