"""A level shared by several client processes (k2bench.harness.load.procs), against the test server's truth."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import time
import urllib.request

import pytest

from k2bench.harness.cli import main
from k2bench.harness.load.client_size import ClientSizer, auto_procs
from k2bench.harness.load.level_watch import LevelWatch
from k2bench.harness.load.loadgen import LevelSpec, build_work, run
from k2bench.harness.load.procs import assign, run_level_procs, split_concurrency
from k2bench.harness.load.procs_rate import split_schedule
from k2bench.harness.load.selfmeasure import cores_available
from k2bench.harness.servers import launch
from k2bench.workloads.prompts import Prompt


@contextlib.contextmanager
def serving(tmp_path, *args: str):
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=list(args), log_dir=tmp_path) as s:
        yield s.base_url


def prompts(n: int, osl: int = 32) -> list[Prompt]:
    # distinct prompt lengths: the server's record of each stream is told apart by its prompt length
    return [Prompt(input_len=8 + i, output_len=osl, token_ids=[100 + j for j in range(8 + i)]) for i in range(n)]


def _child_clock(conn) -> None:
    conn.send(time.monotonic_ns())


def test_monotonic_clock_is_one_clock_for_all_processes():
    """CLOCK_MONOTONIC is system-wide on Linux: a child's reading lies between two of the parent's."""
    ctx = mp.get_context("spawn")
    for _ in range(3):
        r, w = ctx.Pipe(duplex=False)
        before = time.monotonic_ns()
        p = ctx.Process(target=_child_clock, args=(w,))
        p.start()
        stamp = r.recv()
        after = time.monotonic_ns()
        p.join()
        assert before <= stamp <= after


def test_split_is_even_and_in_order():
    assert split_concurrency(10, 3) == [4, 3, 3]
    assert split_concurrency(2, 8) == [1, 1]  # no more processes than requests in flight
    spec = LevelSpec(base_url="http://x", model="m", concurrency=10, num_prompts=30, num_warmup=10)
    parts = assign(build_work(spec, prompts(1)), split_concurrency(10, 3))
    indices = [[rec.index for _, rec in part] for part in parts]
    assert sorted(i for part in indices for i in part) == list(range(40))  # every request exactly once
    assert [len(p) for p in indices] == [16, 12, 12]  # 4/10, 3/10, 3/10 of warmup and measured each
    assert all(p == sorted(p) for p in indices)
    assert indices[0][:4] == [0, 1, 2, 3] and indices[1][:3] == [4, 5, 6]
    assert indices[0][4:8] == [10, 11, 12, 13]  # slot j of the second wave -> the same worker


def test_auto_sizes_by_rate_and_cost():
    # 40k messages/s at 25 us each is one full core: two loops at half load
    assert auto_procs(40_000, 25.0, concurrency=1024, cores=16) == 2
    assert auto_procs(400_000, 25.0, concurrency=1024, cores=16) == 16  # no more than the cores
    assert auto_procs(400_000, 25.0, concurrency=4, cores=16) == 4  # nor the concurrency
    assert auto_procs(None, None, concurrency=64, cores=16) == 1  # nothing known yet
    sizer = ClientSizer("auto", step_s=lambda batch: 0.001)  # 1 ms a step: conc 64 -> 64k messages/s
    assert sizer.procs_for(64) == min(4, cores_available())
    assert ClientSizer("3").procs_for(2) == 2


def test_two_processes_match_the_server(tmp_path):
    """Every request merged once, in index order, concurrency held across processes, and each
    request's TTFT and TPOT as the server timed it."""
    done = []
    with serving(tmp_path, "--ttft-ms", "30", "--itl-ms", "5") as url:
        spec = LevelSpec(base_url=url, model="k2bench-test", concurrency=6, num_prompts=12, num_warmup=6)
        records, meters = run(run_level_procs(spec, prompts(18), 2, on_done=done.append))
        with urllib.request.urlopen(f"{url}/stats?from=0&streams=1") as resp:
            stats = json.loads(resp.read())
    assert [r.index for r in records] == list(range(18))
    assert all(r.success for r in records) and len(done) == 18  # progress saw every request
    assert stats["max_active"] == 6
    assert len(meters) == 2 and all(m["wall_s"] > 0 for m in meters)
    truth = {s["prompt_tokens"]: s for s in stats["streams"]}
    off = []
    for r in records:
        s = truth[r.requested_input_tokens]
        # first to last token, as each side timed it (ms): a late stamp on a busy machine shows here
        off.append(abs((r.token_ns[-1] - r.token_ns[0]) / 1e6 - (s["last_sent"] - s["first_sent"]) * 1e3))
        # TTFT: the client's clock starts before the server's (the request still has to travel)
        assert (r.token_ns[0] - r.send_ns) / 1e6 >= (s["first_sent"] - s["arrived"]) * 1e3 - 1.0
        assert r.prompt_tokens == r.requested_input_tokens  # the server's answer to this very request
    off.sort()  # generous: eight engineers share two cores (load average near 10 at times)
    assert off[len(off) // 2] < 15.0 and off[-1] < 100.0, off


def test_a_killed_worker_fails_the_level_with_the_reason(tmp_path):
    """SIGKILL one worker mid-level: the level stops, says which process died and how; nothing is
    silently dropped (the parent never returns a level that looks complete)."""
    killed = []

    def on_done(rec) -> None:
        if not killed and not rec.warmup:
            victim = sorted(mp.active_children(), key=lambda p: p.name)[-1]
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim.name)

    watch = LevelWatch()
    with serving(tmp_path, "--ttft-ms", "10", "--itl-ms", "10") as url:
        spec = LevelSpec(base_url=url, model="k2bench-test", concurrency=4, num_prompts=40, num_warmup=4)
        records, _ = run(run_level_procs(spec, prompts(4), 2, on_done=on_done, watch=watch))
    assert killed == ["k2bench-client-2"]
    assert watch.stopped == "client process 2 of 2 died (killed by signal 9)"
    assert not watch.server_down
    assert len([r for r in records if not r.warmup]) < 40


@pytest.mark.parametrize("level, mode, completed", [
    (["--conc", "4", "--osl", "32", "--num-prompts", "8"], "closed", 8),
    (["--rate", "20", "--osl", "8", "--num-prompts", "20"], "rate", 20),
], ids=["closed", "rate"])
def test_sweep_with_client_procs(tmp_path, level, mode, completed):
    out = tmp_path / "run.json"
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "2") as url:
        code = main(["sweep", "--url", url, "--isl", "16", *level, "--warmup", "4", "--gpus", "1",
                     "--db", f"sqlite:///{tmp_path}/k.db", "--json", str(out), "--no-telemetry",
                     "--client-procs", "2", "--max-loop-lag-ms", "1000"])
    point = json.loads(out.read_text())["points"][0]
    assert code == 0, point.get("invalid_reason")
    assert point["mode"] == mode and point["completed"] == completed
    assert point["client"]["processes"] == 2 and len(point["client"]["per_process"]) == 2
    assert point["client"]["us_per_message"] > 0


def test_schedule_split_is_round_robin_and_complete():
    parts = split_schedule(10, 3)
    assert parts == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert split_schedule(2, 8) == [[0], [1]]  # no more processes than requests
    assert split_schedule(10, 3) == parts  # the same on every rerun


def test_rate_level_split_keeps_one_schedule(tmp_path):
    """A rate level over three processes: every request sent once, each at its place in the one schedule
    (intended times on the common start, to within the microseconds the hand-over takes), and sent on
    time as the open-loop sender sends in one process."""
    from k2bench.harness.load import openloop, schedule
    from k2bench.harness.load.procs_rate import run_rate_level_procs

    offsets = schedule.arrival_offsets(30, rate=40.0, seed=7)
    done = []
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "2") as url:
        spec = LevelSpec(base_url=url, model="k2bench-test", concurrency=30, num_prompts=25, num_warmup=5)
        records, meters = run(run_rate_level_procs(spec, prompts(30, osl=8), offsets, 40.0, 5, None, 3,
                                                   on_done=done.append))
    assert [r.index for r in records] == list(range(30)) and len(done) == 30 and len(meters) == 3
    assert all(r.success and r.mode == "rate" and r.rate == 40.0 for r in records)
    assert [r.warmup for r in records] == [True] * 5 + [False] * 25
    start = records[0].intended_ns - offsets[0] * 1e9
    for r, o in zip(records, offsets, strict=True):
        assert abs(r.intended_ns - (start + o * 1e9)) < 2e6  # one schedule, one start (2 ms: hand-over)
    lags = sorted((r.send_ns - r.intended_ns) / 1e6 for r in records)
    assert lags[len(lags) // 2] < 20  # sent on time, generously for a shared machine
    figures = openloop.level_figures(records, 40.0)
    assert figures["send_lag_p50_ms"] is not None


