"""The test server's load model: latency grows with the streams it serves, a cap queues the rest.

Each test checks what the server did (its own per-stream stamps) against the model's formula,
computed here by hand, and the client's measurement against the server's stamps."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import urllib.request

import pytest

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


def scheduled_tpot_ms(s: dict) -> float:
    """TPOT as the load model scheduled it (deadlines), without the server's lateness on a busy machine."""
    return (s["last_due"] - s["first_due"]) * 1e3 / (s["tokens"] - 1)


def test_gap_grows_with_running_streams_as_the_formula_says(tmp_path) -> None:
    """ITL = (itl + slope x running) x slower. A closed loop of C holds C streams: TPOT = (2 + 1.5 x C) x 1.3,
    as the model schedules it; what was sent is that or later (the server's lateness), and the client
    measures what was sent."""
    with serving(tmp_path, "--ttft-ms", "300", "--itl-ms", "2", "--itl-slope-ms", "1.5", "--slower", "1.3") as url:
        records = closed_loop(url, 6, 6)  # one wave: all six run side by side from first token to last
        done = streams(url)
    expected = (2 + 1.5 * 6) * 1.3  # 14.3 ms
    assert len(done) == 6
    # The wave arrives within the 390 ms TTFT, so every gap starts with all six admitted, until the first
    # stream ends: the stream that ends first saw six running at every gap, exactly the formula.
    first_to_end = min(done, key=lambda s: s["last_due"])
    assert scheduled_tpot_ms(first_to_end) == pytest.approx(expected, abs=1e-6)
    # later streams' last gaps may start after an earlier one ended: each gap is then priced at five,
    # (2 + 1.5 x 5) x 1.3 = 12.35 ms, never fewer, and never more than the formula at six
    for s in done:
        gaps_at_five = (expected - scheduled_tpot_ms(s)) * (OSL - 1) / (1.5 * 1.3)
        assert -1e-6 <= gaps_at_five <= OSL - 1
        assert gaps_at_five == pytest.approx(round(gaps_at_five), abs=1e-6)  # whole gaps
        assert s["first_sent"] >= s["first_due"] and s["last_sent"] >= s["last_due"]  # the schedule is a floor
    server = [server_tpot_ms(s) for s in done]
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
        assert (s["first_due"] - s["admitted"]) * 1e3 == pytest.approx(10 + 5 * s["running"], abs=1e-6)
    ends = sorted(s["last_sent"] for s in first_two)
    for s, freed_by in zip(last_two, ends, strict=True):  # each waited for a served stream to end, then started afresh
        assert s["admitted"] >= freed_by
        assert s["running"] == 2
        assert (s["first_due"] - s["admitted"]) * 1e3 == pytest.approx(10 + 5 * 2, abs=1e-6)
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
