"""The load generator against the controllable test server, whose timing is the known truth."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import urllib.request

import pytest

from k2bench.errors import ServerError
from k2bench.harness.load.loadgen import LevelSpec, level_failure, run, run_level
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.servers import launch
from k2bench.harness.servers.model_list import served_models
from k2bench.net import free_port
from k2bench.workloads.prompts import Prompt

TTFT_MS, ITL_MS, OSL = 200.0, 15.0, 32


@contextlib.contextmanager
def serving(tmp_path, **options):
    args = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=args, log_dir=tmp_path) as server:
        yield server.base_url


def prompts(n: int = 4, osl: int = OSL, isl: int = 16) -> list[Prompt]:
    return [Prompt(input_len=isl, output_len=osl, token_ids=[1000 + i + j for j in range(isl)]) for i in range(n)]


def level(url: str, conc: int, n: int, warmup: int = 0, osl: int = OSL, timeout_s: float = 60.0):
    spec = LevelSpec(base_url=url, model="k2bench-test", concurrency=conc, num_prompts=n, num_warmup=warmup,
                     timeout_s=timeout_s)
    return asyncio.run(run_level(spec, prompts(osl=osl)))


CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
PIN = len(CORES) >= 2  # as in the bench: server on one core, client on another
PREFILL_US = 500  # the timed server's prefill time per prompt token (see spread_prompts)


@pytest.fixture(scope="module")
def timed_server(tmp_path_factory):
    pin = {"cpu": CORES[0]} if PIN else {}
    with serving(tmp_path_factory.mktemp("ts"), ttft_ms=TTFT_MS, itl_ms=ITL_MS, prefill_us_per_token=PREFILL_US,
                 **pin) as url:
        yield url


def spread_prompts(n: int) -> list[Prompt]:
    """n prompts of distinct lengths, 150 ms or more of prefill apart from first to last.

    Each request is then told apart at the server by its prompt length, and its stream runs on its own
    schedule: with equal prompts a closed loop marches in lockstep (every request of a wave sends each
    token at the same instant), so one stall of the client process on a busy machine moved the median
    of a whole level at once."""
    step = max(1, 300 // n)
    return [Prompt(input_len=16 + i * step, output_len=OSL, token_ids=[1000 + (i + j) % 9000 for j in range(16 + i * step)])
            for i in range(n)]


@contextlib.contextmanager
def client_pinned():
    if not PIN:
        yield
        return
    os.sched_setaffinity(0, {CORES[1]})
    try:
        yield
    finally:
        os.sched_setaffinity(0, CORES)


def server_stats(url: str, first_request: int = 0, streams: bool = False) -> dict:
    with urllib.request.urlopen(f"{url}/stats?from={first_request}" + ("&streams=1" if streams else "")) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("conc", [4, 16, 32])
def test_measured_timing_matches_truth(timed_server: str, conc: int) -> None:
    """TTFT, TPOT, E2EL and throughput as measured by the client agree with what the server did,
    request by request.

    The truth is the server's own record of each stream (matched to the client's request by its prompt
    length): on a busy machine its sleeps overshoot the nominal schedule, and a client that reports the
    overshoot is right. No token is stamped before the server sent it (the same monotonic clock), and
    most requests read their first token before the server sent the second, and their last within two
    gaps: medians over the level, in units of the server's own inter-token gap, which hold on a busy
    2-core machine. (At concurrency 64 a client starved of CPU by other processes falls behind 64 x 67
    messages/s, so that level measured the machine, not the client: the levels are 4, 16 and 32.)"""
    waves = 2
    before = server_stats(timed_server)["requests"]
    spec = LevelSpec(base_url=timed_server, model="k2bench-test", concurrency=conc, num_prompts=waves * conc,
                     num_warmup=conc, timeout_s=60)
    with client_pinned():
        records = run(run_level(spec, spread_prompts(waves * conc + conc)))
    point = summarize_level(records, concurrency=conc, num_gpus=1)
    assert point["completed"] == waves * conc and point["failed"] == 0
    assert point["osl_mismatches"] == 0
    truth = server_stats(timed_server, first_request=before + conc + 1, streams=True)
    assert truth["actual"]["streams"] == waves * conc and truth["actual"]["output_tokens"] == waves * conc * OSL
    streams = {s["prompt_tokens"]: s for s in truth["streams"]}
    measured = [r for r in records if not r.warmup]
    assert sorted(streams) == sorted(r.requested_input_tokens for r in measured)  # one stream per request
    ttft, tpot, e2el = [], [], []  # per request: (client, server) in ms
    late_first, late_last = [], []  # per request: how long after the server sent it the client read it (ms)
    for r in measured:
        s = streams[r.requested_input_tokens]
        assert r.output_tokens == s["tokens"] == OSL and len(r.token_ns) == s["messages"]
        assert s["first_sent"] - s["arrived"] >= (TTFT_MS + r.requested_input_tokens * PREFILL_US / 1e3) / 1e3 - 1e-9  # floor
        late_first.append(r.token_ns[0] / 1e6 - s["first_sent"] * 1e3)
        late_last.append(r.token_ns[-1] / 1e6 - s["last_sent"] * 1e3)
        ttft.append(((r.token_ns[0] - r.send_ns) / 1e6, (s["first_sent"] - s["arrived"]) * 1e3))
        tpot.append(((r.token_ns[-1] - r.token_ns[0]) / 1e6 / (OSL - 1), (s["last_sent"] - s["first_sent"]) * 1e3 / (OSL - 1)))
        e2el.append(((r.token_ns[-1] - r.send_ns) / 1e6, (s["last_sent"] - s["arrived"]) * 1e3))
    # never before the server sent it (1 us: the server's stamps are float seconds)
    assert min(late_first) >= -1e-3 and min(late_last) >= -1e-3
    # for most requests: the first token read before the server's next one was due, the last within two
    # gaps (at a stream's end the client also finishes it and sends the next request)
    assert statistics.median(late_first) < ITL_MS and statistics.median(late_last) < 2 * ITL_MS
    # the level's figures are those of its requests
    assert point["ttft_ms"]["median"] == pytest.approx(statistics.median(c for c, _ in ttft))
    assert point["tpot_ms"]["median"] == pytest.approx(statistics.median(c for c, _ in tpot))
    assert point["e2el_ms"]["median"] == pytest.approx(statistics.median(c for c, _ in e2el))
    # The client's clock starts before the server's (the request must travel; 0.5 ms: the send is stamped
    # just after the write) and stops after it, so it reads no less, and (as above) a little more.
    assert -0.5 <= statistics.median(c - t for c, t in ttft) < ITL_MS
    assert -0.5 <= statistics.median(c - t for c, t in e2el) < 2 * ITL_MS
    # TPOT: the first and last token each read late by at most the above: off by under 2 gaps / (OSL - 1)
    assert statistics.median(abs(c - t) for c, t in tpot) < 2 * ITL_MS / (OSL - 1)
    # closed loop: the client's span (first send to last finish) covers the server's; throughput follows
    sends = [r.send_ns for r in measured]
    assert point["duration_s"] == pytest.approx((max(r.end_ns for r in measured) - min(sends)) / 1e9)
    assert point["duration_s"] >= truth["actual"]["span_s"] - 0.0005
    assert point["output_tput_per_gpu"] == pytest.approx(waves * conc * OSL / point["duration_s"])


def test_server_truth_is_the_nominal_schedule_when_idle(tmp_path) -> None:
    """The server's own record of what it did agrees with its configured timing (one stream)."""
    with serving(tmp_path, ttft_ms=100, itl_ms=10) as url:
        level(url, conc=1, n=3, osl=20)
        truth = server_stats(url)["actual"]
    assert truth["streams"] == 3 and truth["output_tokens"] == 60
    assert 100 <= truth["ttft_p50_ms"] < 100 * 1.5
    assert truth["tpot_p50_ms"] == pytest.approx(10, rel=0.5)
    assert 3 * (0.1 + 19 * 0.01) <= truth["span_s"] < 3 * (0.1 + 19 * 0.01) * 1.5


def test_exactly_n_in_flight_and_warmup_excluded(tmp_path) -> None:
    with serving(tmp_path, ttft_ms=20, itl_ms=2) as url:
        records = level(url, conc=8, n=24, warmup=8, osl=8)
        with urllib.request.urlopen(url + "/stats") as resp:
            stats = json.loads(resp.read())
    assert stats["max_active"] == 8 and stats["requests"] == 32
    assert [r.warmup for r in records] == [True] * 8 + [False] * 24
    assert [r.index for r in records] == list(range(32))
    point = summarize_level(records, concurrency=8, num_gpus=1)
    assert point["num_prompts"] == 24


def test_multi_token_messages_count_usage_not_messages(tmp_path) -> None:
    with serving(tmp_path, ttft_ms=10, itl_ms=4, tokens_per_message=4) as url:
        records = level(url, conc=2, n=2, osl=16)
    for r in records:
        assert r.success and r.output_tokens == 16 and len(r.token_ns) == 4
        assert r.token_ns == sorted(r.token_ns) and r.send_ns < r.token_ns[0] <= r.end_ns


def test_wrong_completion_tokens_flagged_never_replaced(tmp_path) -> None:
    with serving(tmp_path, ttft_ms=5, itl_ms=1, completion_tokens_delta=-3) as url:
        records = level(url, conc=2, n=4, osl=10)
    assert all(r.success and r.output_tokens == 7 and r.osl_mismatch for r in records)
    assert summarize_level(records, concurrency=2, num_gpus=1)["osl_mismatches"] == 4


def test_server_400s_say_what_the_server_said(tmp_path) -> None:
    with serving(tmp_path, fail_status=400) as url:
        with pytest.raises(ServerError, match="HTTP 400.*configured to fail"):
            level(url, conc=2, n=4, warmup=2)
        records = level(url, conc=2, n=4, warmup=0)
    assert not any(r.success for r in records)
    assert "HTTP 400" in level_failure(records) and "configured to fail" in level_failure(records)


def test_some_failures_counted_with_first_messages(tmp_path) -> None:
    with serving(tmp_path, ttft_ms=5, itl_ms=1, fail_status=500, fail_every=3) as url:
        records = level(url, conc=3, n=9, osl=4)
    point = summarize_level(records, concurrency=3, num_gpus=1)
    assert point["failed"] == 3 and point["completed"] == 6
    assert point["errors"] and "HTTP 500" in point["errors"][0]
    assert level_failure(records) is None


def test_stream_ending_early_is_a_failure(tmp_path) -> None:
    with serving(tmp_path, ttft_ms=5, itl_ms=1, end_early_after=5) as url:
        records = level(url, conc=2, n=2, osl=20)
    for r in records:
        assert not r.success
        assert "ended early" in r.error
        assert len(r.token_ns) == 5
    assert "ended early" in level_failure(records)


def test_per_request_timeout(tmp_path) -> None:
    with serving(tmp_path, ttft_ms=3000, itl_ms=1) as url:
        records = level(url, conc=1, n=1, osl=4, timeout_s=0.5)
    assert not records[0].success and "timed out" in records[0].error


def test_unreachable_url_is_a_clear_server_error() -> None:
    port = free_port()
    with pytest.raises(ServerError, match=f"cannot reach the server at http://127.0.0.1:{port}"):
        served_models(f"http://127.0.0.1:{port}/v1")
    records = level(f"http://127.0.0.1:{port}", conc=1, n=1)
    assert "cannot connect" in records[0].error


def test_served_models_lists_what_the_server_serves(tmp_path) -> None:
    with serving(tmp_path) as url:
        assert [m["id"] for m in served_models(url + "/v1/")] == ["k2bench-test"]


async def test_sse_framing_split_anywhere_crlf_comments_and_chat_deltas() -> None:
    """A server that frames SSE unusually: CRLF line ends, comments, event names, chat deltas,
    an empty-content message, and writes cut at arbitrary byte offsets."""
    from aiohttp import web

    from k2bench.harness.load.loadgen import make_session, stream_one
    from k2bench.harness.load.records import RequestRecord

    def msg(obj) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\r\n\r\n"

    delta = lambda text: {"choices": [{"index": 0, "delta": {"content": text}}]}  # noqa: E731
    body = (b": keep-alive comment\r\n\r\n" + msg(delta("")) + b"event: message\r\n" + msg(delta("Hel"))[0:]
            + msg(delta("lo")) + msg(delta(" you")) + msg({"choices": [], "usage": {"prompt_tokens": 3,
                                                                                     "completion_tokens": 3}})
            + b"data: [DONE]\r\n\r\n")

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(body), 7):  # 7-byte writes: every boundary lands mid-message somewhere
            await resp.write(body[i:i + 7])
            await asyncio.sleep(0.001)
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        rec = RequestRecord(index=0, concurrency=1, warmup=False, requested_input_tokens=3,
                            requested_output_tokens=3, send_ns=0)
        async with make_session(10) as session:
            await stream_one(session, f"http://127.0.0.1:{port}/v1/completions", b"{}", rec, 10)
    finally:
        await runner.cleanup()
    assert rec.success, rec.error
    assert len(rec.token_ns) == 3 and rec.output_tokens == 3 and rec.prompt_tokens == 3
    assert rec.send_ns < rec.token_ns[0] <= rec.token_ns[1] <= rec.token_ns[2] <= rec.end_ns


def test_error_event_inside_a_stream_is_reported() -> None:
    from k2bench.harness.load.loadgen import _digest
    from k2bench.harness.load.records import RequestRecord

    rec = RequestRecord(index=0, concurrency=1, warmup=False, requested_input_tokens=1, requested_output_tokens=4,
                        send_ns=0)
    msgs = [b'data: {"choices":[{"text":"a"}]}', b'data: {"error":{"message":"KV cache exhausted"}}',
            b"data: [DONE]"]
    _digest(rec, [1, 2, 3], msgs, None)
    assert not rec.success and "KV cache exhausted" in rec.error and rec.token_ns == [1]


def test_prefill_time_grows_with_prompt_length(tmp_path) -> None:
    """The client's TTFT grows with the prompt as the server's own record says it did.

    Five requests per length (medians: a single request is a single moment that a stall of the client
    on a busy machine can move), compared with the server's record of the same requests."""
    with serving(tmp_path, ttft_ms=20, itl_ms=1, prefill_us_per_token=500) as url:
        short = asyncio.run(run_level(LevelSpec(url, "k2bench-test", 1, 5, 0), prompts(isl=10, osl=4)))
        truth_short = server_stats(url, first_request=1)["actual"]
        long = asyncio.run(run_level(LevelSpec(url, "k2bench-test", 1, 5, 0), prompts(isl=210, osl=4)))
        truth_long = server_stats(url, first_request=6)["actual"]
    assert truth_short["streams"] == truth_long["streams"] == 5
    ttft = [summarize_level(r, concurrency=1, num_gpus=1)["ttft_ms"]["median"] for r in (short, long)]
    # the server's schedule (20 ms + 0.5 ms per prompt token) is a floor it never beats
    assert truth_short["ttft_p50_ms"] >= 25 and truth_long["ttft_p50_ms"] >= 125
    # The client reads no less than the server did, and more by less than a quarter of the prefill time the
    # longer prompt added (a wake-up of the client on a machine with load average 7 took 10 ms)
    grown = truth_long["ttft_p50_ms"] - truth_short["ttft_p50_ms"]
    for measured, truth in ((ttft[0], truth_short), (ttft[1], truth_long)):
        assert truth["ttft_p50_ms"] - 0.5 <= measured <= truth["ttft_p50_ms"] + grown / 4
    assert ttft[1] - ttft[0] == pytest.approx(grown, abs=grown / 4)
