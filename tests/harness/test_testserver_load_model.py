"""The test server's load model: latency grows with the streams it serves, a cap queues the rest.

Each test checks what the server did (its own per-stream stamps) against the model's formula,
computed here by hand, and the client's measurement against the server's stamps."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import urllib.request

from k2bench.harness.load.loadgen import LevelSpec, run_level
from k2bench.harness.measure.metrics import request_metrics
from k2bench.harness.servers import launch
from k2bench.workloads.prompts import Prompt

OSL = 24


@contextlib.contextmanager
def serving(tmp_path, *args: str):
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=list(args), log_dir=tmp_path) as s:
        yield s.base_url


def closed_loop(url: str, conc: int, n: int) -> list:
    prompts = [Prompt(input_len=8, output_len=OSL, token_ids=[100 + i + j for j in range(8)]) for i in range(n)]
    spec = LevelSpec(base_url=url, model="k2bench-test", concurrency=conc, num_prompts=n, num_warmup=0,
                     timeout_s=60)
    return asyncio.run(run_level(spec, prompts))


def streams(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/stats?streams=1") as resp:
        return json.loads(resp.read())["streams"]


def server_tpot_ms(s: dict) -> float:
    return (s["last_sent"] - s["first_sent"]) * 1e3 / (s["tokens"] - 1)


def test_gap_grows_with_running_streams_as_the_formula_says(tmp_path) -> None:
    """ITL = (itl + slope x running) x slower. A closed loop of C holds C streams: TPOT = (2 + 1.5 x C) x 1.3.
    Gaps are chained from deadlines, so lateness does not add up: the server's TPOT is the formula's
    within the lateness of one message spread over 23 gaps."""
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "2", "--itl-slope-ms", "1.5", "--slower", "1.3") as url:
        records = closed_loop(url, 6, 6)  # one wave: all six run side by side from first token to last
        done = streams(url)
    expected = (2 + 1.5 * 6) * 1.3  # 14.3 ms
    server = [server_tpot_ms(s) for s in done]
    assert len(server) == 6
    # a gap priced when fewer than 6 had been admitted (the first arrivals, before the rest came in) is
    # at most 1.5 x 1.3 ms shorter; the wave arrives within the 5 ms TTFT, so every gap sees all six
    assert min(server) >= expected - 0.2
    assert statistics.median(server) <= expected + 1.0
    client = sorted(request_metrics(r, with_itl=False)["tpot_ms"] for r in records)
    assert abs(statistics.median(client) - statistics.median(server)) < 1.0


def test_ttft_grows_with_running_and_the_cap_queues(tmp_path) -> None:
    """--max-running 2 with 4 in flight: two are served, two wait until a slot frees; the waiters'
    admission is the end of a served stream, and each TTFT counts from arrival, queue included."""
    with serving(tmp_path, "--ttft-ms", "10", "--ttft-slope-ms", "5", "--itl-ms", "3", "--max-running", "2") as url:
        records = closed_loop(url, 4, 4)
        done = sorted(streams(url), key=lambda s: s["admitted"])
    assert all(s["running"] <= 2 for s in done)
    first_two, last_two = done[:2], done[2:]
    for s in first_two:  # admitted on arrival; TTFT = 10 + 5 x running at admission
        assert s["admitted"] == s["arrived"]
        assert (s["first_sent"] - s["admitted"]) * 1e3 >= 10 + 5 * s["running"] - 0.01
    ends = sorted(s["last_sent"] for s in first_two)
    for s, freed_by in zip(last_two, ends, strict=True):  # each waited for a served stream to end, then started afresh
        assert s["admitted"] >= freed_by
        assert s["running"] == 2
        assert (s["first_sent"] - s["admitted"]) * 1e3 >= 10 + 5 * 2 - 0.01
    # the client's TTFT of a queued request includes its queue time (about one whole stream of the first pair)
    stream_ms = (10 + 5 * 1) + (OSL - 1) * 3
    ttft = sorted(request_metrics(r, with_itl=False)["ttft_ms"] for r in records)
    assert ttft[-1] >= stream_ms


def test_bad_load_model_flags_are_refused(tmp_path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "k2bench.harness.load.testserver", "--port", "1", "--slower", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--slower must be positive" in out.stderr
