"""The raw HTTP/1.1 transport (k2bench.harness.load.transport) against scripted servers and the test server.

The scripted server answers with exactly the bytes a test gives it, so framing, failures and connection
reuse are checked byte for byte; the test server checks the stamps against what it did."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request

import aiohttp
import pytest

from k2bench.harness.load import loadgen, transport
from k2bench.harness.load.level_watch import CANNOT_CONNECT, CONNECTION_CLOSED, CONNECTION_LOST, TIMED_OUT
from k2bench.harness.load.loadgen import LevelSpec, make_session, run_level, stream_one
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.load.sse import _Stream
from k2bench.harness.load.transport import RawSession
from k2bench.harness.servers import launch
from k2bench.net import free_port
from k2bench.workloads.prompts import Prompt


def sse(*objs) -> bytes:
    return b"".join(b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n" for o in objs)


TOKENS = [{"choices": [{"index": 0, "text": f" t{i}"}]} for i in range(3)]
USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
BODY = sse(*TOKENS, USAGE, b"[DONE]")


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


OK_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def record() -> RequestRecord:
    return RequestRecord(index=0, concurrency=1, warmup=False, requested_input_tokens=5, requested_output_tokens=3,
                         send_ns=0)


@contextlib.asynccontextmanager
async def scripted(respond):
    """A server that reads each request (headers and Content-Length body) and calls ``respond(writer,
    request)``; it keeps the connection for the next request unless ``respond`` closed it. Yields the URL
    and a list of what it saw: one entry per connection, each the list of its requests."""
    seen: list[list[bytes]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mine: list[bytes] = []
        seen.append(mine)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                mine.append(head + await reader.readexactly(length))
                await respond(writer, mine[-1])
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/completions", seen
    finally:
        server.close()
        await server.wait_closed()


def replies(*parts: bytes, close: bool = False, pause: float = 0.0):
    async def respond(writer: asyncio.StreamWriter, request: bytes) -> None:
        for p in parts:
            writer.write(p)
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
        if close:
            writer.close()
    return respond


async def one(url: str, timeout_s: float = 10.0, session=None) -> RequestRecord:
    rec = record()
    if session is not None:
        await stream_one(session, url, b"{}", rec, timeout_s)
        return rec
    async with RawSession(timeout_s) as s:
        await stream_one(s, url, b"{}", rec, timeout_s)
    return rec


async def both(respond, timeout_s: float = 10.0) -> tuple[RequestRecord, RequestRecord]:
    """The same scripted answer read by the raw transport and by aiohttp."""
    async with scripted(respond) as (url, _):
        raw = await one(url, timeout_s)
        async with loadgen._aiohttp_session(timeout_s, None) as s:
            via_aiohttp = await one(url, timeout_s, s)
    return raw, via_aiohttp


def succeeded(rec: RequestRecord) -> None:
    assert rec.success, rec.error
    assert len(rec.token_ns) == 3 and rec.output_tokens == 3 and rec.prompt_tokens == 5
    assert rec.send_ns <= rec.token_ns[0] <= rec.token_ns[-1] <= rec.end_ns


async def test_chunked_and_content_length_bodies() -> None:
    for answer in (OK_CHUNKED + chunked(BODY[:40], BODY[40:]),
                   b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)):
        raw, via_aiohttp = await both(replies(answer))
        succeeded(raw)
        succeeded(via_aiohttp)


async def test_body_ended_by_closing_the_connection() -> None:
    rec = None
    async with scripted(replies(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY, close=True)) as (url, _):
        rec = await one(url)
    succeeded(rec)


def test_every_split_of_the_response_stamps_each_token_at_the_read_that_completed_it(monkeypatch) -> None:
    """The whole response (status line, chunk framing, SSE with CRLF and a comment) cut into two reads at
    every byte: each token message is stamped with the read in which its blank line arrived."""
    body = (b": comment\r\n\r\n" + sse(*TOKENS[:2]).replace(b"\n", b"\r\n") + sse(TOKENS[2], USAGE, b"[DONE]"))
    pieces = (body[:25], body[25:63], body[63:])  # chunk boundaries inside a message and inside a blank line
    wire = OK_CHUNKED + chunked(*pieces)
    # the wire offset of each body byte, from the chunk framing written above
    at_wire, start = [], len(OK_CHUNKED)
    for p in pieces:
        start += len(b"%x\r\n" % len(p))
        at_wire += range(start, start + len(p))
        start += len(p) + 2
    # each token message is complete once the last byte of its blank line has arrived (found in the body)
    ends, at = [], 0
    for tok, blank in zip(TOKENS, (b"\r\n\r\n", b"\r\n\r\n", b"\n\n"), strict=True):
        at = body.index(blank, body.index(json.dumps(tok).encode(), at)) + len(blank)
        ends.append(at_wire[at - 1] + 1)
    clock = iter(range(1, 10**6))
    monkeypatch.setattr(transport.time, "monotonic_ns", lambda: next(clock))
    loop = asyncio.new_event_loop()
    try:
        for cut in range(1, len(wire)):
            conn = transport._Conn()
            conn.transport = type("T", (), {"close": lambda self: None})()
            state = _Stream([])
            waiter = loop.create_future()
            conn.begin(state, waiter)
            conn.data_received(wire[:cut])
            first = conn.t
            conn.data_received(wire[cut:])
            assert waiter.done() and waiter.result() is None, cut
            want = [first if end <= cut else conn.t for end in ends]
            assert state.token_ns == want, (cut, state.token_ns, want)
            assert state.done and state.output_tokens == 3
    finally:
        loop.close()


def test_feed_one_scan_path_agrees_with_the_general_split() -> None:
    """A read holding exactly one one-line message takes feed's one-scan path; reads of any other shape take
    the general split. Fed message by message, or in 5-byte pieces, the stream reads the same."""
    body = sse(*TOKENS, {"choices": [{"index": 0, "text": ""}]}, USAGE, b"[DONE]")
    messages = [m + b"\n\n" for m in body.split(b"\n\n")[:-1]]
    by_message, general, pieces = _Stream([]), _Stream([]), _Stream([])
    for i, m in enumerate(messages):
        by_message.feed(m, i)
        general.split(m, i)
    for i in range(0, len(body), 5):
        pieces.feed(body[i:i + 5], i)
    for s in (by_message, general, pieces):
        s.end(99)
    assert by_message.token_ns == general.token_ns == [0, 1, 2]  # the empty-text message carries no token
    # in 5-byte pieces, each token is stamped with the piece holding its blank line's last byte
    assert pieces.token_ns == [(body.index(b"\n\n", body.index(json.dumps(t).encode())) + 1) // 5 * 5 for t in TOKENS]
    for s in (by_message, general, pieces):
        assert s.done and s.output_tokens == 3 and s.prompt_tokens == 5 and s.error is None


async def test_http_errors_carry_status_reason_and_body() -> None:
    for status, reason in ((400, b"Bad Request"), (503, b"Service Unavailable")):
        text = b'{"object":"error","message":"no such model"}'
        answer = b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n\r\n%s" % (status, reason, len(text), text)
        raw, via_aiohttp = await both(replies(answer))
        assert not raw.success and raw.error == f"HTTP {status} {reason.decode()}: {text.decode()}"
        assert raw.error == via_aiohttp.error


async def test_connection_lost_before_and_during_the_response() -> None:
    mid, mid_aiohttp = await both(replies(OK_CHUNKED + chunked(sse(*TOKENS[:2]))[:-5], close=True, pause=0.05))
    assert mid.error.startswith(CONNECTION_CLOSED) and mid.error.endswith("(after 2 token messages)")
    assert mid_aiohttp.error.startswith(CONNECTION_CLOSED) and len(mid.token_ns) == len(mid_aiohttp.token_ns) == 2
    before, before_aiohttp = await both(replies(close=True))
    assert before.error.startswith(CONNECTION_LOST) and before_aiohttp.error.startswith(CONNECTION_LOST)


async def test_timeout_and_refused_connection() -> None:
    stall = replies(OK_CHUNKED + chunked(sse(TOKENS[0]))[:-5], pause=5.0)
    slow, slow_aiohttp = await both(stall, timeout_s=0.3)
    assert slow.error == slow_aiohttp.error == f"{TIMED_OUT} after 0.3 s (per-request --timeout) (after 1 token messages)"
    port = free_port()  # nothing listens there
    refused = await one(f"http://127.0.0.1:{port}/v1/completions")
    assert refused.error.startswith(CANNOT_CONNECT) and f"127.0.0.1:{port}" in refused.error
    assert not refused.success
    # an attempt counts as sent, as on aiohttp's path: a level stopped on a dead server keeps its record
    assert 0 < refused.send_ns <= refused.end_ns


async def test_keep_alive_reuses_one_connection_and_a_closing_answer_does_not() -> None:
    answer = OK_CHUNKED + chunked(BODY)
    for extra, connections in ((b"", 1), (b"Connection: close\r\n", 3)):
        async with scripted(replies(answer.replace(b"\r\n\r\n", b"\r\n" + extra + b"\r\n", 1))) as (url, seen):
            async with RawSession(10) as s:
                recs = [await one(url, session=s) for _ in range(3)]
        assert all(r.success for r in recs), [r.error for r in recs]
        assert len(seen) == connections and sum(map(len, seen)) == 3


async def test_request_carries_path_headers_key_and_body() -> None:
    async with scripted(replies(OK_CHUNKED + chunked(BODY))) as (url, seen):
        async with RawSession(10, api_key="sk-test") as s:
            rec = record()
            await stream_one(s, url + "?x=1", b'{"a":1}', rec, 10)
    succeeded(rec)
    request = seen[0][0]
    assert request.startswith(b"POST /v1/completions?x=1 HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer sk-test\r\n" in request and b"\r\nContent-Length: 7\r\n" in request
    assert request.endswith(b'\r\n\r\n{"a":1}')


async def test_malformed_response_is_refused_clearly() -> None:
    async with scripted(replies(b"HTTP/1.1 two-hundred OK\r\n\r\n" + BODY, close=True)) as (url, _):
        rec = await one(url)
    assert not rec.success and rec.error.startswith("malformed HTTP response from the server")


async def test_cancelled_request_abandons_its_connection() -> None:
    async with scripted(replies(OK_CHUNKED + chunked(sse(TOKENS[0]))[:-5], pause=5.0)) as (url, seen):
        async with RawSession(10) as s:
            task = asyncio.ensure_future(one(url, session=s))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not s._idle.get(("127.0.0.1", int(url.split(":")[2].split("/")[0])))


def test_session_choice_falls_back_to_aiohttp_where_raw_cannot_go(monkeypatch) -> None:
    async def kind(url: str | None) -> type:
        s = make_session(5, None, url)
        async with s:
            return type(s)

    monkeypatch.delenv(transport.TRANSPORT_ENV, raising=False)
    assert asyncio.run(kind("http://127.0.0.1:8000/v1/completions")) is RawSession
    for url in ("http://user:pw@127.0.0.1:8000/v1/completions", "https://127.0.0.1/v1/completions", None):
        assert asyncio.run(kind(url)) is aiohttp.ClientSession, url
    monkeypatch.setenv(transport.TRANSPORT_ENV, "aiohttp")
    assert asyncio.run(kind("http://127.0.0.1:8000/v1/completions")) is aiohttp.ClientSession
    monkeypatch.setenv(transport.TRANSPORT_ENV, "raw")
    monkeypatch.setattr(transport, "httptools", None)  # not installed
    assert asyncio.run(kind("http://127.0.0.1:8000/v1/completions")) is aiohttp.ClientSession
    monkeypatch.setenv(transport.TRANSPORT_ENV, "curl")
    with pytest.raises(ValueError, match="K2BENCH_TRANSPORT='curl': expected one of raw, aiohttp"):
        make_session(5, None, "http://127.0.0.1:8000/v1/completions")
    with pytest.raises(ValueError, match="plain http:// only"):
        RawSession(5)._head("https://example.com/v1/completions")


def test_both_transports_stamp_every_token_after_the_server_sent_it(tmp_path, monkeypatch) -> None:
    """Each token the test server sent is stamped once, by either transport, no earlier than it left the
    server (the server's clock is this machine's monotonic clock)."""
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=["--ttft-ms=5", "--itl-ms=2"],
                            log_dir=tmp_path) as server:
        url = server.base_url
        got = {}
        for name in ("raw", "aiohttp", "raw"):
            monkeypatch.setenv(transport.TRANSPORT_ENV, name)
            with urllib.request.urlopen(f"{url}/stats", timeout=5) as resp:
                first = json.loads(resp.read())["requests"] + 1
            prompts = [Prompt(input_len=4 + i, output_len=40, token_ids=[7] * (4 + i)) for i in range(8)]
            spec = LevelSpec(base_url=url, model="k2bench-test", concurrency=8, num_prompts=8, num_warmup=0)
            records = asyncio.run(run_level(spec, prompts))
            with urllib.request.urlopen(f"{url}/stats?from={first}&streams=1", timeout=5) as resp:
                streams = {s["prompt_tokens"]: s for s in json.loads(resp.read())["streams"]}
            for r in records:
                s = streams[r.requested_input_tokens]
                assert r.success, r.error
                assert len(r.token_ns) == s["messages"] == r.output_tokens == 40
                assert r.token_ns[0] >= s["first_sent"] * 1e9 and r.token_ns[-1] >= s["last_sent"] * 1e9
                assert r.token_ns == sorted(r.token_ns) and r.send_ns < r.token_ns[0] <= r.end_ns
            got[name] = sum(len(r.token_ns) for r in records)
    assert got["raw"] == got["aiohttp"] == 8 * 40
