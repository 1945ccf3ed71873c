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


def test_stored_split_matches_the_servers_streams(tmp_path, capsys, monkeypatch):
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

    # `show` prints the split beside the client's TTFT: client mean, server TTFT, their gap
    monkeypatch.setenv("COLUMNS", "300")
    capsys.readouterr()
    assert main(["show", "--db", db, "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("At the server"))
    row = next(line for line in lines[start:] if line.startswith("│"))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[:4] == ["4", f"{point['ttft_ms']['mean']:.1f}", f"{point['server_ttft_ms']:.1f}",
                         f"{point['ttft_ms']['mean'] - point['server_ttft_ms']:.1f}"]


def test_several_metrics_urls_are_scraped_and_labelled_by_instance(tmp_path):
    """Two servers' /metrics (as a disaggregated server's workers): one serves the requests, the other
    sees none. Every sample carries its instance; the idle one adds nothing to the split."""
    db, out = f"sqlite:///{tmp_path}/k.db", tmp_path / "run.json"
    args = ["--queue-ms=20", "--ttft-ms=30", "--itl-ms=2", "--metrics"]
    with launch.from_recipe("testserver", model="k2bench-test", log_dir=tmp_path / "a", extra_args=args) as busy, \
            launch.from_recipe("testserver", model="k2bench-test", log_dir=tmp_path / "b", extra_args=args) as idle:
        urls = [f"{busy.base_url}/metrics", idle.base_url]  # the endpoint itself, or a server root
        code = main(["sweep", "--url", busy.base_url, "--isl", "16", "--osl", str(OSL), "--conc", "2",
                     "--num-prompts", str(MEASURED), "--warmup", str(WARMUP), "--db", db, "--json", str(out),
                     *(f"--metrics-url={u}" for u in urls)])
        assert code == 0
        truth = _truth(busy.base_url)
    (point,) = json.loads(out.read_text())["points"]
    sm = point["server_metrics"]
    instances = [u.split("//", 1)[1].split("/", 1)[0] for u in urls]
    assert sm["instances"] == instances
    counts = {k: v for k, v in sm["counters"].items() if k.startswith("vllm:request_queue_time_seconds_count")}
    assert counts == {f'vllm:request_queue_time_seconds_count{{instance="{instances[0]}"}}': MEASURED,
                      f'vllm:request_queue_time_seconds_count{{instance="{instances[1]}"}}': 0}
    assert point["server_queue_ms"]["median"] == pytest.approx(statistics.median(truth["queue"]), rel=0.05)
    assert point["server_ttft_ms"] == pytest.approx(statistics.fmean(truth["ttft"]), rel=0.05)


def test_acceptance_of_a_speculating_server_is_stored_and_shown(tmp_path, capsys, monkeypatch):
    """The test server counts vLLM's spec_decode counters as a server drafting 3 tokens per step with 2.8
    tokens per step would: the stored acceptance is the one its streams imply, from the window alone."""
    db, out = f"sqlite:///{tmp_path}/k.db", tmp_path / "run.json"
    osl = 29  # 28 tokens after the first: 10 steps of 2.8 each
    with launch.from_recipe("testserver", model="k2bench-test", log_dir=tmp_path,
                            extra_args=["--ttft-ms=5", "--itl-ms=1", "--metrics", "--spec-tokens=3",
                                        "--spec-accept-len=2.8"]) as server:
        assert main(["sweep", "--url", server.base_url, "--isl", "16", "--osl", str(osl), "--conc", "2",
                     "--num-prompts", "6", "--warmup", "2", "--db", db, "--json", str(out)]) == 0
    (point,) = json.loads(out.read_text())["points"]
    spec = point["server_metrics"]["speculation"]
    assert (spec["drafts"], spec["draft_tokens"], spec["accepted_tokens"]) == (6 * 10, 6 * 30, 6 * 18)  # measured only
    assert point["spec_accept_len"] == pytest.approx(2.8) and point["spec_accept_rate"] == pytest.approx(0.6)
    monkeypatch.setenv("COLUMNS", "300")
    capsys.readouterr()
    assert main(["show", "--db", db, "1"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")][-1]
    assert [c.strip() for c in row.strip("│").split("│")][-2:] == ["2.80", "0.600"]


@pytest.mark.parametrize("extra,message", [
    (["--metrics-url", "ftp://host/metrics"], "expected an http(s) URL"),
    (["--metrics-url", "http://host:port/metrics"], "port is not a number"),
    (["--metrics-url", "http://127.0.0.1:9/metrics", "--no-telemetry"], "give one of them"),
])
def test_bad_metrics_urls_are_one_line_errors(tmp_path, capsys, extra, message):
    code = main(["sweep", "--url", "http://127.0.0.1:9", "--conc", "1", "--db", f"sqlite:///{tmp_path}/k.db", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_test_server_refuses_an_impossible_acceptance_length(capsys):
    from k2bench.harness.load import testserver

    with pytest.raises(SystemExit) as exc:
        testserver.main(["--port", "1", "--metrics", "--spec-tokens", "3", "--spec-accept-len", "4.5"])
    assert exc.value.code == 2 and "from 1 to --spec-tokens + 1 (4)" in capsys.readouterr().err
