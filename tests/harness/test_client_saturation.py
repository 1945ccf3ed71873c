"""A client that cannot keep up makes its level invalid, with the reason; the same level unslowed is valid.

The test-only switch K2BENCH_TEST_BURN_US_PER_CHUNK (sse._BURN_NS in-process) burns CPU on every chunk
read, as a slow parser would: 8 streams at a message every 10 ms are 800 chunks/s, so 2 ms a chunk asks
for 1.6 cores of a loop that has one. On a quiet machine that shows as CPU; on this 2-core machine
shared by eight engineers the burning loop gets only part of a core, and it shows as lag (and demand).
The unslowed level is judged with a loose lag bound: a process waiting for a core here shows as lag."""

from __future__ import annotations

import contextlib
import json

import pytest

from k2bench.harness.cli import main
from k2bench.harness.load import sse
from k2bench.harness.servers import launch


@contextlib.contextmanager
def serving(tmp_path, *args: str):
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=list(args), log_dir=tmp_path) as s:
        yield s.base_url


def sweep(tmp_path, url: str, name: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / f"{name}.json"
    code = main(["sweep", "--url", url, "--isl", "16", "--osl", "64", "--conc", "8", "--num-prompts", "16",
                 "--warmup", "8", "--gpus", "1", "--db", f"sqlite:///{tmp_path}/k.db", "--json", str(out),
                 "--no-telemetry", *extra])
    return code, json.loads(out.read_text())["points"][0]


@pytest.mark.parametrize("burn_us", [0, 2000])
def test_burning_client_is_invalid_with_the_reason(tmp_path, monkeypatch, capsys, burn_us: int) -> None:
    monkeypatch.setattr(sse, "_BURN_NS", burn_us * 1000)
    with serving(tmp_path, "--ttft-ms", "20", "--itl-ms", "10") as url:
        code, point = sweep(tmp_path, url, "burn", *(() if burn_us else ("--max-loop-lag-ms", "1000")))
    client = point["client"]
    # one process, ticking every 5 ms (fewer ticks when the loop is saturated: they wait too)
    assert client["processes"] == 1 and client["lag_samples"] >= 10
    assert client["cores_available"] >= client["cores_given"] == 1
    assert client["cpu_share"] == pytest.approx(client["cpu_cores"])
    if burn_us:
        assert code == 1, capsys.readouterr().err
        assert not point["valid"]
        assert "the client was the bottleneck" in point["invalid_reason"]
        # the loop was never idle: burning, or waiting for a core to burn on
        assert client["demand_max"] > 0.9 and client["demand_max"] >= client["busy_max"]
        if client["busy_max"] > 0.9:
            assert "--max-client-cpu" in point["invalid_reason"]
        else:
            assert "--max-loop-lag-ms" in point["invalid_reason"] and client["lag_p99_ms"] > 50
    else:
        assert code == 0, capsys.readouterr().err
        assert point["valid"], point["invalid_reason"]
        assert client["busy_max"] < 0.5
    assert point["client_lag_p99_ms"] == client["lag_p99_ms"]


def test_lag_bound_judges_the_loop(tmp_path, monkeypatch) -> None:
    """The same burn, judged by the lag bound alone: each 2 ms burn holds every callback behind it."""
    # (the CPU bound is out of reach at 5 cores)
    monkeypatch.setattr(sse, "_BURN_NS", 2_000_000)
    with serving(tmp_path, "--ttft-ms", "20", "--itl-ms", "10") as url:
        code, point = sweep(tmp_path, url, "lag", "--max-client-cpu", "5", "--max-loop-lag-ms", "1")
    assert code == 1 and not point["valid"]
    assert "--max-loop-lag-ms 1" in point["invalid_reason"] and "--max-client-cpu" not in point["invalid_reason"]
    assert point["client"]["lag_p99_ms"] > 1.0


def _part(cpu: float, wait: float, wall: float, lag99: float) -> dict:
    return {"cpu_s": cpu, "wait_s": wait, "wall_s": wall, "busy": cpu / wall, "demand": (cpu + wait) / wall,
            "lag_p50_ms": lag99 / 10, "lag_p99_ms": lag99, "lag_max_ms": lag99 * 2, "lag_samples": 100}


def test_combine_and_the_rule_by_hand() -> None:
    from k2bench.harness.load.selfmeasure import combine
    from k2bench.harness.measure.validity import ValidityRules, client_bottleneck

    # two processes over 10 s: 6 s and 2 s of CPU, the first also waited 3.5 s for a core
    client = combine([_part(6.0, 3.5, 10.0, 4.0), _part(2.0, 0.0, 9.0, 60.0)], cores=16)
    assert client["cpu_cores"] == pytest.approx(0.8)  # 8 s of CPU over the longest window, 10 s
    assert client["cores_given"] == 2 and client["cpu_share"] == pytest.approx(0.4)
    assert client["demand_max"] == pytest.approx(0.95) and client["busy_max"] == pytest.approx(0.6)
    assert client["lag_p99_ms"] == 60.0  # the worst process's
    why = client_bottleneck(client, ValidityRules(max_client_cpu=0.5))
    assert why == ("the client was the bottleneck: its busiest event loop used 60% of a core (> --max-client-cpu "
                   "0.5) and its event loop ran callbacks 60.0 ms late at p99 (> --max-loop-lag-ms 50); more "
                   "--client-procs may help")
    # demand (95%: CPU and run-queue wait) is kept for reading, not judged
    assert client_bottleneck(client, ValidityRules(max_loop_lag_ms=61)) is None
    # all the cores in use already: no hint to add processes
    full = combine([_part(9.6, 0.0, 10.0, 1.0), _part(1.0, 0.0, 10.0, 1.0)], cores=2)
    assert client_bottleneck(full, ValidityRules()).endswith("used 96% of a core (> --max-client-cpu 0.9)")
    assert client_bottleneck(None, ValidityRules()) is None  # not measured (an imported level)
    # a window under a second is not judged: a handful of samples, one hiccup decides them
    short = combine([_part(0.5, 0.0, 0.5, 400.0)], cores=2)
    assert client_bottleneck(short, ValidityRules()) is None
