"""A lean HTTP/1.1 client for the load generator's one job: POST a body and read its SSE stream.

aiohttp wakes the reading coroutine once per chunk (a future, a task step and a buffer copy each
time); at 32k tokens/s in one process that is most of the client's CPU. Here the response is read by
an ``asyncio.Protocol``: each read is stamped in ``data_received``, handed to httptools' parser (which
decodes chunked transfer) and straight on to the shared SSE splitter (k2bench.harness.load.sse); the
request's coroutine wakes once, when the response is over. Connections are kept alive in a pool per
session (one session per level), so a request's clock does not include a TCP handshake.

It speaks plain ``http://`` without credentials in the URL; anything else goes through aiohttp (see
``raw_supported``), as does everything when ``K2BENCH_TRANSPORT=aiohttp`` or httptools is not installed. Failures are described with
the same openings as the aiohttp path (k2bench.harness.load.level_watch), which is what a level's stop
rules read.
"""

from __future__ import annotations

import asyncio
import os
import time
from urllib.parse import urlsplit

try:  # the response parser; without it every request goes through aiohttp
    import httptools
except ImportError:  # pragma: no cover - depends on the environment
    httptools = None

from k2bench.harness import redact
from k2bench.harness.load.level_watch import (
    CANNOT_CONNECT,
    CONNECTION_CLOSED,
    CONNECTION_LOST,
    ERRORS_KEPT,
    TIMED_OUT,
)
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.load.sse import _Stream

TRANSPORT_ENV = "K2BENCH_TRANSPORT"  # "aiohttp": every request through aiohttp; unset or "raw": this client
TRANSPORTS = ("raw", "aiohttp")
CONNECT_TIMEOUT_S = 30.0  # as the aiohttp session's connect timeout

# how a request's wait ended, besides a complete response (None)
_LOST, _TIMEOUT, _MALFORMED = 1, 2, 3


def transport_choice() -> str:
    """The transport asked for by the environment; a clear error for an unknown name."""
    name = (os.environ.get(TRANSPORT_ENV) or "raw").strip().lower()
    if name not in TRANSPORTS:
        raise ValueError(f"{TRANSPORT_ENV}={name!r}: expected one of {', '.join(TRANSPORTS)}")
    return name


def raw_supported(url: str) -> bool:
    """Whether this client can send to ``url``: httptools installed, plain http, a host, no user:password."""
    parts = urlsplit(url)
    return httptools is not None and parts.scheme == "http" and bool(parts.hostname) and parts.username is None and parts.password is None


def _describe(exc: BaseException) -> str:
    text = redact.text(str(exc)) or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text}"[:ERRORS_KEPT]


class _Conn(asyncio.Protocol):
    """One kept-alive connection; it reads one response at a time into the request that owns it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.lost_exc: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.state: _Stream | None = None
        self.t = 0
        self.status = 0
        self.reason = b""
        self.error_body: list[bytes] | None = None
        self.headers_done = False
        self.framed = False  # the body's end is marked (Content-Length or chunked), not the connection's close
        self.reusable = False  # the response that just ended left the connection open for another
        self.malformed: BaseException | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.t = time.monotonic_ns()  # arrival: before any parsing
        if self.waiter is None:  # bytes nobody asked for on an idle connection: it cannot be reused
            self.lost = True
            self.transport.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.malformed = exc
            self._wake(_MALFORMED)
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost, self.lost_exc = True, exc
        if self.waiter is not None and not self.waiter.done():
            if self.headers_done and not self.framed:  # a body that ends with the connection, as HTTP/1.0 did
                self.state.end(time.monotonic_ns())
                self._wake(None)
            else:
                self._wake(_LOST)

    # -- httptools callbacks
    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.status = self.parser.get_status_code()
        if self.status != 200:
            self.error_body = []

    def on_body(self, body: bytes) -> None:
        if self.error_body is None:
            self.state.feed(body, self.t)
        else:
            self.error_body.append(body)

    def on_message_complete(self) -> None:
        self.reusable = self.parser.should_keep_alive()  # (the parser forgets it once this returns)
        if self.error_body is None:
            self.state.end(self.t)
        self._wake(None)

    # -- the request's side
    def begin(self, state: _Stream, waiter: asyncio.Future) -> None:
        self.state, self.waiter = state, waiter
        self.status, self.reason, self.error_body, self.headers_done, self.framed = 0, b"", None, False, False
        self.reusable = False

    def _wake(self, how: int | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(how)

    def time_out(self) -> None:
        self._wake(_TIMEOUT)
        self.transport.close()


class RawSession:
    """A level's connections and request heads: the counterpart of the aiohttp session."""

    def __init__(self, timeout_s: float, api_key: str | None = None) -> None:
        self.timeout_s = timeout_s
        self.api_key = api_key
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._busy: set[_Conn] = set()
        self._heads: dict[str, tuple[tuple[str, int], bytes]] = {}

    async def __aenter__(self) -> RawSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                c.transport.close()
        for c in self._busy:
            c.transport.close()
        self._idle.clear()
        self._busy.clear()

    def _head(self, url: str) -> tuple[tuple[str, int], bytes]:
        """The request line and headers for ``url``, up to the Content-Length value: built once per URL."""
        known = self._heads.get(url)
        if known is not None:
            return known
        if not raw_supported(url):
            raise ValueError(f"the raw transport cannot send to {redact.text(url)} (plain http:// only, "
                             "no credentials in the URL)")
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        auth = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
        head = (f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nUser-Agent: k2bench\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{auth}Content-Length: ").encode()
        known = ((parts.hostname, parts.port or 80), head)
        self._heads[url] = known
        return known

    async def _connect(self, key: tuple[str, int], timeout_s: float) -> _Conn:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.lost:
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(loop.create_connection(_Conn, key[0], key[1]), timeout_s)
        return conn

    async def stream(self, url: str, body: bytes, rec: RequestRecord, state: _Stream, timeout_s: float) -> None:
        """Send ``body`` to ``url`` and read the answer into ``state`` and ``rec`` (as loadgen.stream_one
        does through aiohttp); never raises for a failed request."""
        key, head = self._head(url)
        loop = asyncio.get_running_loop()
        now = time.monotonic_ns
        start = loop.time()
        # Stamped at the attempt, as the aiohttp path does, so that a request that failed to connect
        # counts as sent (a stopped level keeps the records of what was sent); replaced at the write.
        rec.send_ns = now()
        try:
            conn = await self._connect(key, min(timeout_s, CONNECT_TIMEOUT_S))
        except asyncio.TimeoutError:
            return self._end(rec, state, f"{TIMED_OUT} after {timeout_s:g} s (per-request --timeout)")
        except OSError as exc:
            return self._end(rec, state, f"{CANNOT_CONNECT} {key[0]}:{key[1]} ({_describe(exc)})")
        waiter = loop.create_future()
        conn.begin(state, waiter)
        self._busy.add(conn)
        timer = loop.call_at(start + timeout_s, conn.time_out)
        try:
            request = b"%s%d\r\n\r\n%s" % (head, len(body), body)
            rec.send_ns = now()  # just before the request is written (as aiohttp's chunk-sent trace stamps it)
            conn.transport.write(request)
            how = await waiter
        except BaseException:  # cancelled (a stopped level): the connection is abandoned mid-response
            conn.transport.close()
            raise
        finally:
            timer.cancel()
            self._busy.discard(conn)
            conn.waiter = conn.state = None
        if how is None and not conn.lost and conn.reusable:
            self._idle.setdefault(key, []).append(conn)
        elif not conn.lost:
            conn.transport.close()
        if how is None and conn.error_body is not None:
            text = b"".join(conn.error_body).decode(errors="replace").strip()
            rec.end_ns = now()
            rec.error = f"HTTP {conn.status} {conn.reason.decode(errors='replace')}: {text}"[:ERRORS_KEPT]
            return None
        failure = None
        if how == _TIMEOUT:
            failure = f"{TIMED_OUT} after {timeout_s:g} s (per-request --timeout)"
        elif how == _MALFORMED:
            failure = f"malformed HTTP response from the server ({_describe(conn.malformed)})"
        elif how == _LOST:
            why = _describe(conn.lost_exc) if conn.lost_exc else "the server closed it"
            failure = (f"{CONNECTION_CLOSED} mid-response ({why})" if conn.headers_done
                       else f"{CONNECTION_LOST} before the response's headers ({why})")
        return self._end(rec, state, failure)

    @staticmethod
    def _end(rec: RequestRecord, state: _Stream, failure: str | None) -> None:
        rec.end_ns = time.monotonic_ns()
        state.finish(rec, failure)
