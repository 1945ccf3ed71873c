"""The open-loop sender against the test server: requests leave on schedule, whatever is in flight, and
the in-flight cap holds requests in the client's queue. Checked against what the server saw."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import urllib.request

import pytest

from k2bench.harness.load import openloop, schedule
from k2bench.harness.load.loadgen import LevelSpec
from k2bench.harness.servers import launch
from k2bench.workloads.prompts import Prompt


@contextlib.contextmanager
def serving(tmp_path, *args: str):
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=list(args), log_dir=tmp_path) as s:
        yield s.base_url


def prompts(n: int, osl: int = 4) -> list[Prompt]:
    return [Prompt(input_len=8, output_len=osl, token_ids=[1000 + i + j for j in range(8)]) for i in range(n)]


def server_stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/stats?streams=1", timeout=10) as resp:
        return json.loads(resp.read())


def run(url: str, offsets: list[float], warm: int, rate: float, cap: int | None = None, osl: int = 4):
    spec = LevelSpec(base_url=url, model="k2bench-test", concurrency=openloop.in_flight_cap(cap, len(offsets)),
                     num_prompts=len(offsets) - warm, num_warmup=warm, timeout_s=60)
    return asyncio.run(openloop.run_rate_level(spec, prompts(len(offsets), osl), offsets, rate, warm, cap))


def test_requests_leave_at_their_intended_times_whatever_is_in_flight(tmp_path) -> None:
    """Streams last ~0.5 s and requests are due every ~25 ms: a closed loop of any small N could not send
    them, an open loop sends each on time (many in flight at once, as the server counts)."""
    offsets = schedule.arrival_offsets(40, 40.0, seed=2)
    with serving(tmp_path, "--ttft-ms", "100", "--itl-ms", "100") as url:
        records = run(url, offsets, warm=5, rate=40.0)
        seen = server_stats(url)
    assert len(records) == 40 and all(r.success for r in records)
    assert [r.warmup for r in records] == [True] * 5 + [False] * 35
    start = records[0].intended_ns - int(offsets[0] * 1e9)
    for r, t in zip(records, offsets, strict=True):  # intended time is the schedule's, actual time is after it
        assert r.intended_ns == start + int(round(t * 1e9)) and r.send_ns >= r.intended_ns and r.queue_ns == 0
    assert seen["max_active"] > 8  # the server had many streams at once: nothing waited for a finish
    # the server's arrival clock (CLOCK_MONOTONIC too) saw each request after the client sent it
    arrived = sorted(s["arrived"] for s in seen["streams"])
    sent = sorted(r.send_ns / 1e9 for r in records)
    assert all(a >= s for a, s in zip(arrived, sent, strict=True))
    figures = openloop.level_figures(records, 40.0)
    asked = openloop.scheduled_rate(records)
    assert figures["achieved_rate"] == pytest.approx(asked, rel=0.25)  # generous: a busy shared machine
    assert figures["send_lag_p50_ms"] >= 0 and figures["queue_p99_ms"] == 0


def test_the_cap_holds_requests_in_the_client_queue_and_records_the_wait(tmp_path) -> None:
    """Ten requests due at once with a cap of 2 on streams of ~0.3 s: the server never sees more than 2,
    and each held request's queue time is about the streams ahead of it."""
    offsets = [0.0] * 10
    with serving(tmp_path, "--ttft-ms", "100", "--itl-ms", "50") as url:
        records = run(url, offsets, warm=0, rate=math.inf, cap=2)
        seen = server_stats(url)
    assert all(r.success for r in records) and seen["max_active"] <= 2
    assert records[0].queue_ns == 0 and records[1].queue_ns == 0
    for r in records[2:]:
        assert r.queue_ns > 0 and r.send_ns - r.intended_ns >= r.queue_ns
    # the k-th pair waits for the k earlier pairs' streams; each stream ends when the server said it did
    streams = sorted(seen["streams"], key=lambda s: s["arrived"])
    first_pair_done = min(s["last_sent"] for s in streams[:2])
    assert records[2].send_ns / 1e9 >= first_pair_done - 0.005  # released by a finish, not before it
    lags = openloop.send_lags_ns(records)
    assert len(lags) == 10 and max(lags) < min(r.queue_ns for r in records[2:])  # lag excludes the queue


def test_a_stop_during_a_long_gap_ends_the_level_without_waiting_for_the_next_send(tmp_path) -> None:
    """The level's time limit passes while the next request is 60 s away: the level ends long before
    that, and the request never sent is not returned."""
    import time

    from k2bench.harness.load.level_watch import LevelWatch

    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "1") as url:
        spec = LevelSpec(base_url=url, model="k2bench-test", concurrency=2, num_prompts=2, num_warmup=0,
                         timeout_s=60)
        watch = LevelWatch(timeout_s=0.5)
        t0 = time.monotonic()
        records = asyncio.run(openloop.run_rate_level(spec, prompts(2), [0.0, 60.0], 1 / 60, 0, watch=watch))
        elapsed = time.monotonic() - t0
    assert watch.stopped is not None and [r.index for r in records] == [0]
    assert elapsed < 30  # a generous bound: without the stop it would have waited the whole 60 s gap
