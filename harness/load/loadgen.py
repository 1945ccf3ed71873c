"""Closed-loop load generator: exactly N streaming requests in flight, every SSE message stamped.

The numbers are only as good as the clock, so the hot path does as little as possible: the
request bodies are serialised before the level starts, the response is read chunk by chunk
straight off the connection, each chunk is stamped with ``time.monotonic_ns()`` the moment it is
handed over, and the SSE framing is split with bytes operations (k2bench.harness.load.sse). One
session with no connection cap serves the whole level, and its connections are reused (warmup opens
them), so a request's clock does not include a TCP handshake. The session is the raw HTTP/1.1 client
of k2bench.harness.load.transport where it can serve the URL, else (or with
``K2BENCH_TRANSPORT=aiohttp``) an ``aiohttp.ClientSession``.

A message "carries a token" when its first choice has non-empty ``text`` (completions),
non-empty ``delta.content`` (chat), or non-empty ``token_ids``. Messages that carry several
tokens count as one arrival (one ITL gap); ``usage.completion_tokens`` is the output length.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from k2bench.errors import ServerError
from k2bench.harness import redact
from k2bench.harness.load.level_watch import (
    CANNOT_CONNECT,
    CONNECTION_CLOSED,
    CONNECTION_LOST,
    ERRORS_KEPT,
    TIMED_OUT,
    LevelWatch,
)
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.load.selfmeasure import SelfMeter
from k2bench.harness.load.sse import _Stream
from k2bench.harness.load.transport import RawSession, raw_supported, transport_choice
from k2bench.net import normalize_base_url
from k2bench.workloads.prompts import Prompt

try:  # an event loop with less overhead per wake-up: lower client CPU and steadier stamps
    import uvloop as _uvloop
except ImportError:  # pragma: no cover - depends on the environment
    _uvloop = None

try:  # optional, faster; the stdlib serialiser gives the same bodies
    import orjson

    _dumps = orjson.dumps
    _NUMPY = orjson.OPT_SERIALIZE_NUMPY
except ImportError:  # pragma: no cover - depends on the environment
    _dumps = None
    _NUMPY = 0

Session = RawSession | aiohttp.ClientSession  # what make_session gives: the raw transport's or aiohttp's
READ_BUFSIZE = 4 << 20  # per-response buffer: never let a burst of messages stall the socket
def event_loop_name() -> str:
    return "uvloop" if _use_uvloop() else "asyncio"


def _use_uvloop() -> bool:
    return _uvloop is not None and sys.version_info >= (3, 11) and os.environ.get("K2BENCH_NO_UVLOOP") != "1"


def _allow_open_files(connections: int) -> None:
    """Raise this process's open-file limit towards its hard limit when a level needs more sockets than
    the soft limit (often 1,024) allows: concurrency 1,024 in one process would fail on EMFILE."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + 256  # the loop, pipes, log files, the telemetry's own connections
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))


def run(coro):
    """Run a coroutine to completion on uvloop where it is installed (set K2BENCH_NO_UVLOOP=1 to
    use the standard loop), else on asyncio's own loop."""
    if _use_uvloop():
        with asyncio.Runner(loop_factory=_uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


@dataclass
class LevelSpec:
    """What one concurrency level sends: the defaults are InferenceX's."""

    base_url: str
    model: str
    concurrency: int
    num_prompts: int
    num_warmup: int
    timeout_s: float = 1800.0
    extra_body: dict = field(default_factory=dict)
    api_key: str | None = None  # sent as "Authorization: Bearer KEY"
    path: str | None = None  # the endpoint: None, from the level's prompts (with_endpoint)


COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


def endpoint(prompt: Prompt) -> str:
    return CHAT if prompt.chat else COMPLETIONS


def with_endpoint(spec: LevelSpec, prompts: Sequence[Prompt]) -> LevelSpec:
    """``spec`` with the endpoint its prompts go to (a level's prompts are all of one kind: text through
    the chat endpoint, token ids through completions)."""
    if spec.path is not None or not prompts:
        return spec
    return dataclasses.replace(spec, path=endpoint(prompts[0]))


def level_url(spec: LevelSpec) -> str:
    return normalize_base_url(spec.base_url) + (spec.path or COMPLETIONS)


def request_body(model: str, prompt: Prompt, extra: dict | None = None, messages: list[dict] | None = None) -> bytes:
    """The streaming request of one prompt: a completion of its token ids or text, or (``prompt.chat``) a
    chat completion of ``messages`` (default: the prompt's text as the one user message)."""
    body = {
        "model": model,
        **({"messages": messages or [{"role": "user", "content": prompt.text or ""}]} if prompt.chat
           else {"prompt": prompt.prompt}),
        "max_tokens": prompt.output_len,
        "min_tokens": prompt.output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body.update(extra or {})
    if _dumps is not None:
        return _dumps(body, option=_NUMPY)
    if hasattr(body.get("prompt"), "tolist"):
        body["prompt"] = body["prompt"].tolist()
    return json.dumps(body, separators=(",", ":")).encode()


async def _on_body_sent(session: aiohttp.ClientSession, ctx, params: aiohttp.TraceRequestChunkSentParams) -> None:
    rec = ctx.trace_request_ctx
    if rec is not None:
        rec.send_ns = time.monotonic_ns()


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def make_session(timeout_s: float, api_key: str | None = None,
                 url: str | None = None) -> Session:
    """One session for a whole level: no cap on connections (the closed loop is the cap), kept alive.
    The raw transport (k2bench.harness.load.transport) serves ``url`` when it can and
    ``K2BENCH_TRANSPORT`` does not say aiohttp; without ``url``, aiohttp."""
    if url is not None and transport_choice() == "raw" and raw_supported(url):
        return RawSession(timeout_s, api_key)
    return _aiohttp_session(timeout_s, api_key)


def _aiohttp_session(timeout_s: float, api_key: str | None) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=3600,
                                     enable_cleanup_closed=False)
    # The request's clock starts when its body has been handed to the socket, not when the
    # coroutine asked to send it: with N requests issued at once (every wave of a closed loop),
    # the gap between the two is the client's own queueing, which must not count as TTFT.
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_on_body_sent)
    return aiohttp.ClientSession(
        connector=connector,
        trace_configs=[trace],
        read_bufsize=READ_BUFSIZE,
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=timeout_s, connect=min(timeout_s, 30.0)),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream", **_auth(api_key)},
    )


def _describe(exc: BaseException) -> str:
    """The exception as a stored error; aiohttp's messages carry the request URL, password included."""
    text = redact.text(str(exc)) or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text}"[:ERRORS_KEPT]


async def stream_one(session: Session, url: str, body: bytes, rec: RequestRecord,
                     timeout_s: float, text: list[str] | None = None) -> RequestRecord:
    """Send one streaming request and fill ``rec`` (and ``text`` with the answer, when given); never raises
    for a failed request."""
    state = _Stream(rec.token_ns, text)
    if session.__class__ is RawSession:
        await session.stream(url, body, rec, state, timeout_s)
        return rec
    failure: str | None = None
    now = time.monotonic_ns
    rec.send_ns = now()  # replaced by the moment the body was written (see make_session)
    try:
        async with session.post(url, data=body, trace_request_ctx=rec) as resp:
            if resp.status != 200:
                text = (await resp.text(errors="replace")).strip()
                rec.end_ns = now()
                rec.error = f"HTTP {resp.status} {resp.reason}: {text}"[:ERRORS_KEPT]
                return rec
            content = resp.content
            feed = state.feed
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                feed(chunk, now())  # stamped on arrival: before any splitting or parsing
            state.end(now())
    except asyncio.TimeoutError:
        failure = f"{TIMED_OUT} after {timeout_s:g} s (per-request --timeout)"
    except aiohttp.ClientPayloadError as exc:
        failure = f"{CONNECTION_CLOSED} mid-response ({_describe(exc)})"
    except aiohttp.ClientConnectorError as exc:
        failure = f"{CANNOT_CONNECT} {_describe(exc)}"
    except (aiohttp.ServerDisconnectedError, ConnectionResetError, aiohttp.ClientOSError) as exc:
        failure = f"{CONNECTION_LOST} {_describe(exc)}"
    except (aiohttp.ClientError, OSError) as exc:
        failure = _describe(exc)
    rec.end_ns = now()
    state.finish(rec, failure)
    return rec


async def send_one(session: Session, url: str, body: bytes, rec: RequestRecord, timeout_s: float,
                   watch: LevelWatch, on_done: Callable[[RequestRecord], None] | None = None,
                   text: list[str] | None = None) -> None:
    """One request of a level, whichever loop sends it: streamed into ``rec``; a stop that cuts it off
    in flight fails it with the reason; once it has ended, ``watch`` counts it and ``on_done`` gets it."""
    try:
        await stream_one(session, url, body, rec, timeout_s, text)
    except asyncio.CancelledError:
        if watch.stopped is not None:
            rec.end_ns, rec.success = time.monotonic_ns(), False
            rec.error = f"stopped in flight: {watch.stopped}"[:ERRORS_KEPT]
        raise
    watch.finished(rec)
    if on_done is not None:
        on_done(rec)


def _digest(rec: RequestRecord, stamps: list[int], messages: list[bytes], failure: str | None) -> None:
    """Fill ``rec`` from already split (stamp, SSE message) pairs (what stream_one does on the fly)."""
    state = _Stream(rec.token_ns)
    for t, msg in zip(stamps, messages, strict=True):
        state.message(msg, t)
    state.finish(rec, failure)


async def _closed_loop(session: Session, url: str, work: Sequence[tuple[bytes, RequestRecord]],
                       concurrency: int, timeout_s: float,
                       on_done: Callable[[RequestRecord], None] | None, watch: LevelWatch) -> None:
    queue = iter(work)

    async def worker() -> None:
        for body, rec in queue:  # the shared iterator hands each request to exactly one worker
            if watch.stopped is not None:
                return  # this one is never sent (send_ns stays 0)
            await send_one(session, url, body, rec, timeout_s, watch, on_done)

    watch._tasks = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(work)))]
    results = await asyncio.gather(*watch._tasks, return_exceptions=True)
    for result in results:  # a stop cancels workers; anything else a worker raised is a bug to show
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


def build_work(spec: LevelSpec, prompts: Sequence[Prompt]) -> list[tuple[bytes, RequestRecord]]:
    """Each request of a level (warmup first) as its serialised body and the record it will fill: built
    before the level starts, so that nothing of it runs on the hot path. Prompts are used in order and
    reused cyclically if there are fewer than requests."""
    if not prompts:
        raise ValueError("no prompts")
    work: list[tuple[bytes, RequestRecord]] = []
    for i in range(spec.num_warmup + spec.num_prompts):
        p = prompts[i % len(prompts)]
        rec = RequestRecord(index=i, concurrency=spec.concurrency, warmup=i < spec.num_warmup,
                            requested_input_tokens=p.input_len, requested_output_tokens=p.output_len, send_ns=0)
        work.append((request_body(spec.model, p, spec.extra_body), rec))
    return work


async def run_level(spec: LevelSpec, prompts: Sequence[Prompt],
                    on_done: Callable[[RequestRecord], None] | None = None,
                    watch: LevelWatch | None = None,
                    on_window: tuple[Callable[[], None], Callable[[], None]] | None = None,
                    meter: SelfMeter | None = None) -> list[RequestRecord]:
    """Warm up, then run ``spec.num_prompts`` requests with ``spec.concurrency`` always in flight.

    Returns warmup records first (``warmup=True``) then measured ones; indices count across both.
    When ``watch`` stops the level early, only the requests that were sent are returned (see
    ``watch.stopped``). ``on_window`` (start, end) brackets the measured requests: start runs once every
    warmup request has finished, end once every measured one has (telemetry windows; both are blocking
    calls, run in a worker thread). ``meter`` measures the client over the measured requests (see
    selfmeasure). Several processes share a level through k2bench.harness.load.procs.
    """
    spec = with_endpoint(spec, prompts)
    return await run_work(spec, build_work(spec, prompts), on_done, watch, on_window, meter)


async def run_work(spec: LevelSpec, work: Sequence[tuple[bytes, RequestRecord]],
                   on_done: Callable[[RequestRecord], None] | None = None,
                   watch: LevelWatch | None = None,
                   on_window: tuple[Callable[[], None], Callable[[], None]] | None = None,
                   meter: SelfMeter | None = None, check_warmup: bool = True) -> list[RequestRecord]:
    """`run_level` on requests already built (`build_work`), ``spec.concurrency`` of them in flight: one
    process's share of a level when several share it (``check_warmup=False``: the level's warmup is
    judged where all shares meet)."""
    watch = watch or LevelWatch()
    _allow_open_files(spec.concurrency)
    url = level_url(spec)
    warm = [w for w in work if w[1].warmup]
    measured = [w for w in work if not w[1].warmup]
    deadline = None if watch.timeout_s is None else time.monotonic_ns() + int(watch.timeout_s * 1e9)
    watcher = asyncio.ensure_future(watch.watch(deadline))
    gc.collect()
    gc.disable()  # a collection pause would land in somebody's TTFT
    try:
        async with make_session(spec.timeout_s, spec.api_key, url) as session:
            if warm:
                await _closed_loop(session, url, warm, spec.concurrency, spec.timeout_s, on_done, watch)
                if check_warmup and watch.stopped is None and not any(r.success for _, r in warm):
                    raise ServerError(f"every warmup request failed; first error: {warm[0][1].error}")
            if watch.stopped is None:
                if on_window is not None:
                    await asyncio.to_thread(on_window[0])  # off the loop: a server in this process still answers
                if meter is not None:
                    meter.start()
                try:
                    await _closed_loop(session, url, measured, spec.concurrency, spec.timeout_s, on_done, watch)
                finally:
                    if meter is not None:
                        meter.stop()
                    if on_window is not None:
                        await asyncio.to_thread(on_window[1])
    finally:
        gc.enable()
        watcher.cancel()
    if watch.stopped is not None:
        return [rec for _, rec in work if rec.send_ns]
    return [rec for _, rec in work]


def level_failure(records: Sequence[RequestRecord]) -> str | None:
    """A one-line reason when no measured request of a level succeeded, else None."""
    measured = [r for r in records if not r.warmup]
    if measured and not any(r.success for r in measured):
        return f"all {len(measured)} requests failed; first error: {measured[0].error}"
    return None
