"""One response's server-sent events, read as they arrive: the framing split and the token stamps.

Both transports (the raw one in k2bench.harness.load.transport and aiohttp's) hand each piece of the
decoded body to `_Stream.feed` with the moment it came off the socket, and `_Stream.end` once the body
is over, so the two cannot differ in how they split ``data:`` events or which message a stamp belongs
to. A message "carries a token" when its first choice has non-empty ``text`` (completions), non-empty
``delta.content`` (chat), or non-empty ``token_ids``; messages carrying several tokens count as one
arrival, and ``usage.completion_tokens`` is the output length.
"""

from __future__ import annotations

import json
import os
import time

from k2bench.harness.load.level_watch import ERRORS_KEPT
from k2bench.harness.load.records import RequestRecord

try:  # optional, faster; the stdlib parser gives the same answers
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

# Test-only: burn this many microseconds of CPU per piece of body read, to show that a saturated client
# makes its level invalid (tests/harness/test_client_saturation.py). Read once, at import.
BURN_ENV = "K2BENCH_TEST_BURN_US_PER_CHUNK"
_BURN_NS = int(float(os.environ.get(BURN_ENV) or 0) * 1e3)


def _burn() -> None:
    end = time.thread_time_ns() + _BURN_NS
    while time.thread_time_ns() < end:
        pass


class _Stream:
    """What one response's SSE messages said so far. Messages are handled as they arrive (a few
    microseconds each) rather than all at the end of the stream: streams of a closed loop end
    together, and parsing a thousand messages for each of them at once would hold up the stamps
    of every other stream."""

    __slots__ = ("token_ns", "done", "error", "prompt_tokens", "output_tokens", "cached_tokens", "text", "tail")

    def __init__(self, token_ns: list[int], text: list[str] | None = None) -> None:
        self.token_ns = token_ns
        self.done = False
        self.error: str | None = None
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.text = text  # when a list, the answer's text is collected into it (conversations)
        self.tail = b""  # the start of a message whose blank line has not arrived yet

    def feed(self, chunk: bytes, t: int) -> None:
        """A piece of the body that arrived at ``t``: every message it completes is stamped ``t``."""
        if _BURN_NS:
            _burn()
        if not self.tail and chunk.find(b"\n") == len(chunk) - 2 and chunk[-1:] == b"\n" and chunk[:6] == b"data: ":
            # the usual piece: exactly one one-line message and its blank line (one scan, no split)
            self.payload(chunk[6:-2], t)
        else:
            self.split(chunk, t)

    def split(self, chunk: bytes, t: int) -> None:
        """`feed`'s general path: any number of messages, CRLF line ends, a message cut across reads."""
        if self.tail:
            chunk = self.tail + chunk
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        if b"\n\n" not in chunk:
            self.tail = chunk
            return
        parts = chunk.split(b"\n\n")
        self.tail = parts.pop()
        payload = self.payload
        for part in parts:
            if part[:6] == b"data: " and b"\n" not in part:
                payload(part[6:], t)
            else:
                self.message(part, t)

    def end(self, t: int) -> None:
        """The body is over: a last message without its blank line still counts."""
        if self.tail.strip():
            self.message(self.tail, t)
        self.tail = b""

    def message(self, msg: bytes, t: int) -> None:
        if msg[:6] == b"data: " and b"\n" not in msg:  # the usual one-line message
            self.payload(msg[6:], t)
            return
        for line in msg.split(b"\n"):  # comments, event names, ids, multi-line data
            if line.startswith(b"data:"):
                self.payload(line[5:].strip(), t)

    def payload(self, data: bytes, t: int) -> None:
        if data == b"[DONE]":
            if self.done:
                self.error = self.error or "two [DONE] messages"
            self.done = True
            return
        if self.done:
            self.error = self.error or "data after [DONE]"
        try:
            obj = _loads(data)
        except ValueError:
            self.error = self.error or f"unparseable SSE message: {data[:200]!r}"
            return
        if obj.__class__ is not dict:
            return
        choices = obj.get("choices")
        if choices:
            c = choices[0]
            if c.get("text") or c.get("token_ids"):
                self.token_ns.append(t)
                if self.text is not None:
                    self.text.append(c.get("text") or "")
            else:
                delta = c.get("delta")
                if delta and delta.get("content"):
                    self.token_ns.append(t)
                    if self.text is not None:
                        self.text.append(delta["content"])
        usage = obj.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens")
            self.output_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details")
            if details.__class__ is dict and details.get("cached_tokens") is not None:
                self.cached_tokens = details["cached_tokens"]
        elif not choices and (obj.get("error") is not None or obj.get("object") == "error"):
            err = obj.get("error", obj)
            text = err.get("message", err) if isinstance(err, dict) else err
            self.error = self.error or f"server error in stream: {text}"[:ERRORS_KEPT]

    def finish(self, rec: RequestRecord, failure: str | None) -> None:
        rec.prompt_tokens, rec.output_tokens = self.prompt_tokens, self.output_tokens
        rec.cached_tokens = self.cached_tokens
        n = len(self.token_ns)
        error = failure or self.error
        if error is None and not self.done:
            error = f"stream ended early: no [DONE] after {n} token messages"
        if error is None and rec.output_tokens is None:
            error = "server sent no usage.completion_tokens (does it honour stream_options.include_usage?)"
        if error is None and not n:
            error = "stream carried no tokens"
        if failure is not None and n:
            error = f"{error} (after {n} token messages)"
        rec.error = None if error is None else error[:ERRORS_KEPT]
        rec.success = error is None
