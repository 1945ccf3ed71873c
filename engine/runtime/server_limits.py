"""Limits that keep one client from starving the others: request sizes, slow or idle connections, and
how many connections are open at once.

aiohttp bounds the body (`client_max_size`) but, depending on its version, not the time a client may take
to send a request head, nor the number of open connections. `ConnectionGuard` wraps each connection's
aiohttp protocol: a connection that has not delivered a complete request head within `request_timeout`
(from its opening, or from the end of its previous request) is closed, and a connection beyond
`max_connections` gets a 503 and is closed at once. Bodies get the same deadline in the server's reader.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# A request body also carries JSON syntax and escapes (a control character is 6 bytes as \\u0000):
# the body limit is this many times the largest prompt, plus room for the other fields and messages.
JSON_OVERHEAD = 6
BODY_SLACK = 1 << 20
MIN_TOKEN_BYTES = 4
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"


@dataclass
class ServerLimits:
    """The serving limits, one place for their defaults (the CLI reads them for its help)."""

    request_timeout: float = 30.0  # seconds to send a whole request; an idle connection is closed after it
    max_connections: int = 1024  # open connections at once; more get a 503
    max_request_bytes: int | None = None  # None: derived from max_model_len (see `body_limit`)

    def validate(self) -> None:
        if not self.request_timeout > 0:
            raise ValueError(f"--request-timeout must be > 0 seconds (got {self.request_timeout})")
        if self.max_connections < 1:
            raise ValueError(f"--max-connections must be >= 1 (got {self.max_connections})")
        if self.max_request_bytes is not None and self.max_request_bytes < 1024:
            raise ValueError(f"--max-request-bytes must be >= 1024 (got {self.max_request_bytes})")

    def body_limit(self, max_model_len: int, bytes_per_token: int) -> int:
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        # the largest prompt that can fit, as text (escaped) or as token ids ("123456," per token)
        return max_model_len * max(JSON_OVERHEAD * bytes_per_token, 8) + BODY_SLACK


def longest_token_bytes(tokenizer) -> int:
    """Bytes of the longest vocabulary entry: a text of more than max_model_len times this many bytes
    cannot encode to max_model_len tokens or fewer, so it is refused before tokenising."""
    if tokenizer is None:
        return MIN_TOKEN_BYTES
    vocab = tokenizer.vocab_strings()
    return max(MIN_TOKEN_BYTES, max((len(t.encode()) for t in vocab), default=0))


class _Busy(asyncio.Protocol):
    """Answers a connection over the cap with a 503 and closes it."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        body = b'{"error":{"message":"too many connections","type":"server_error","param":null,"code":null}}'
        transport.write(_BUSY + b"Content-Length: %d\r\n\r\n" % len(body) + body)  # type: ignore[attr-defined]
        transport.close()


class _Guarded(asyncio.Protocol):
    """One connection: forwards to aiohttp's protocol and closes the transport at a missed deadline."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard, self.inner = guard, inner
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._busy = 0

    def arm(self) -> None:
        self.disarm()
        if self.transport is not None and not self._busy:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.guard.limits.request_timeout, self._expire)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.transport is not None and not self._busy:
            self.transport.close()  # idle, or a request head that never finished arriving

    def request_started(self) -> None:
        self._busy += 1
        self.disarm()

    def request_done(self) -> None:
        self._busy -= 1
        self.arm()

    # ---- asyncio.Protocol, forwarded --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.guard.open[transport] = self
        self.arm()
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        self.guard.open.pop(self.transport, None)
        self.transport = None
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class ConnectionGuard:
    """The protocol factory handed to `loop.create_server` in place of aiohttp's own."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], limits: ServerLimits) -> None:
        self.factory = factory
        self.limits = limits
        self.open: dict[asyncio.BaseTransport, _Guarded] = {}
        self.refused = 0

    def __call__(self) -> asyncio.Protocol:
        if len(self.open) >= self.limits.max_connections:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("connection cap (%d) reached: refused %d connections so far",
                            self.limits.max_connections, self.refused)
            return _Busy()
        return _Guarded(self, self.factory())

    def started(self, transport: asyncio.BaseTransport | None) -> _Guarded | None:
        """Called as a request's handler starts: its connection is no longer idle."""
        conn = self.open.get(transport) if transport is not None else None
        if conn is not None:
            conn.request_started()
        return conn
