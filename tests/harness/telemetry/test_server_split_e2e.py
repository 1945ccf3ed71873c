"""The server-side time split end to end: `k2bench sweep` against the test server, which holds each
request 30 ms as queued, answers 50 ms after that, and exposes vLLM's phase histograms. The stored
split is checked against what the server's streams actually did (its /stats records of the measured
requests), not against the configured numbers or a clock, so it holds on a busy machine."""

from __future__ import annotations

import json
import statistics
import urllib.request

import pytest

from k2bench.harness.cli import main
from k2bench.harness.servers import launch

MEASURED, WARMUP, OSL = 24, 4, 8


def _truth(base_url: str) -> dict[str, list[float]]:
    with urllib.request.urlopen(f"{base_url}/stats?streams=1", timeout=10) as resp:
        streams = sorted(json.load(resp)["streams"], key=lambda s: s["number"])[-MEASURED:]
    ms = 1e3
    return {"queue": [(s["scheduled"] - s["arrived"]) * ms for s in streams],
            "prefill": [(s["first_sent"] - s["scheduled"]) * ms for s in streams],
            "decode": [(s["last_sent"] - s["first_sent"]) * ms for s in streams],
            "inference": [(s["last_sent"] - s["scheduled"]) * ms for s in streams],
            "ttft": [(s["first_sent"] - s["arrived"]) * ms for s in streams]}


def test_stored_split_matches_the_servers_streams(tmp_path):
    db, out = f"sqlite:///{tmp_path}/k.db", tmp_path / "run.json"
    with launch.from_recipe("testserver", model="k2bench-test", log_dir=tmp_path,
                            extra_args=["--queue-ms=30", "--ttft-ms=50", "--itl-ms=5", "--metrics"]) as server:
        code = main(["sweep", "--url", server.base_url, "--isl", "16", "--osl", str(OSL), "--conc", "4",
                     "--num-prompts", str(MEASURED), "--warmup", str(WARMUP), "--db", db, "--json", str(out)])
        assert code == 0
        truth = _truth(server.base_url)
    (point,) = json.loads(out.read_text())["points"]
    assert point["server_metrics"]["split"]["queue"]["count"] == MEASURED  # the window holds exactly the measured
    for phase in ("queue", "prefill", "decode", "inference"):
        stored = point[f"server_{phase}_ms"]
        assert stored["mean"] == pytest.approx(statistics.fmean(truth[phase]), rel=0.05), phase
        assert stored["median"] == pytest.approx(statistics.median(truth[phase]), rel=0.05), phase
        assert stored["p99"] <= max(truth[phase]) * 1.05 and stored["p99"] >= statistics.median(truth[phase]) * 0.95
    assert point["server_ttft_ms"] == pytest.approx(statistics.fmean(truth["ttft"]), rel=0.05)
    # the client's TTFT also holds the way to the server and back: a little more, never less
    gap = point["ttft_ms"]["mean"] - point["server_ttft_ms"]
    assert 0 < gap < 0.5 * point["server_ttft_ms"], gap
    assert point["spec_accept_len"] is None and point["spec_accept_rate"] is None  # it does not speculate
