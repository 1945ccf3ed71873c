"""When a level must stop before its last request, and how failed requests are told apart.

A benchmark against a dead server must not go on firing requests at it: each would fail at once and
the level's few finished requests would be summarised as if nothing happened. The load generator
reports every finished request to a `LevelWatch`, which also polls the launched server's process
and the level's time limit, and cancels the level's requests at once when one of them says stop.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from k2bench.harness.load.records import RequestRecord

ERRORS_KEPT = 400  # characters of an error kept in a record
# How a failed request's error begins (the load generator writes them; the checks below read them)
TIMED_OUT = "timed out"
CANNOT_CONNECT = "cannot connect:"
CONNECTION_LOST = "connection lost:"
CONNECTION_CLOSED = "stream ended early: connection closed"
CONNECTION_ERRORS_TO_STOP = 3  # in a row, with no success between: the server is gone
STOP_POLL_S = 0.1  # how often a running level asks whether it must stop
# How long a level stopped on connection errors waits for a launched server's exit to show, so that the
# reason names how it ended (a killed process's sockets close before its parent can see it has exited).
EXIT_SHOWS_WITHIN_S = 5.0
# an HTTP 400 saying a prompt's token ids are not in the server's vocabulary (the bundled engine, vLLM, SGLang)
_VOCAB_REJECTION = re.compile(r"^HTTP 400\b.*(vocab|token[ _]id|out of range)", re.IGNORECASE | re.DOTALL)


def timed_out(rec: RequestRecord) -> bool:
    return bool(rec.error) and rec.error.startswith(TIMED_OUT)


def prompt_rejected(rec: RequestRecord) -> bool:
    """The server refused the prompt's token ids as outside its vocabulary."""
    return bool(rec.error) and _VOCAB_REJECTION.search(rec.error) is not None


def connection_failed(rec: RequestRecord) -> bool:
    """The request failed because the connection did (refused, reset, closed mid-stream): what a dead
    server looks like from the client, unlike an HTTP error answer."""
    return bool(rec.error) and rec.error.startswith((CANNOT_CONNECT, CONNECTION_LOST, CONNECTION_CLOSED))


@dataclass
class LevelWatch:
    """Why a level may stop before its last request, and (after it ran) whether and why it did.

    A launched server's death is seen within STOP_POLL_S of its exit (``server_gone`` returns how it
    ended; given seconds, it may wait that long for an exit to show), an attached server's after
    CONNECTION_ERRORS_TO_STOP connection errors in a row; either stops the level at once rather than
    firing its remaining requests at a dead address. ``timeout_s`` bounds the whole level (warmup
    included)."""

    server_gone: Callable[..., str | None] = lambda wait_s=0.0: None
    timeout_s: float | None = None
    connection_errors_to_stop: int = CONNECTION_ERRORS_TO_STOP
    stopped: str | None = None  # the reason the level stopped early, if it did
    server_down: bool = False  # it stopped because the server is gone
    prompts_rejected: bool = False  # it stopped because the server refused the prompts' token ids
    _streak: int = 0
    _on_errors: bool = False  # it stopped on a run of connection errors, not on a seen exit
    _tasks: list[asyncio.Task] = field(default_factory=list)

    def stop(self, reason: str, server_down: bool) -> None:
        if self.stopped is None:
            self.stopped, self.server_down = reason, server_down
            for task in self._tasks:
                task.cancel()

    def finished(self, rec: RequestRecord) -> None:
        """Called as each request ends: a run of connection errors means the server is gone; token ids
        outside the server's vocabulary mean every other request would fail the same way."""
        if prompt_rejected(rec):
            self.prompts_rejected = True
            self.stop(f"the server rejected a prompt: {rec.error}", server_down=False)
            return
        if rec.success or not connection_failed(rec):
            self._streak = 0
            return
        self._streak += 1
        note = self.server_gone()
        if note:
            self.stop(note, server_down=True)
        elif self._streak >= self.connection_errors_to_stop:
            self._on_errors = self.stopped is None
            self.stop(f"the server is gone: {self._streak} connection errors in a row with no success "
                      f"between (last: {rec.error})", server_down=True)

    def name_the_exit(self) -> None:
        """After a level stopped on connection errors: if the launched server has in fact exited, make the
        reason say how. The kernel closes a killed process's sockets before its parent can reap it, so on
        a busy machine the client may count its connection errors before the exit can be seen."""
        if self._on_errors:
            note = self.server_gone(EXIT_SHOWS_WITHIN_S)
            if note:
                self.stopped = note

    async def watch(self, deadline_ns: int | None) -> None:
        while self.stopped is None:
            await asyncio.sleep(STOP_POLL_S)
            note = self.server_gone()
            if note:
                self.stop(note, server_down=True)
            elif deadline_ns is not None and time.monotonic_ns() > deadline_ns:
                self.stop(f"the level ran longer than --level-timeout {self.timeout_s:g} s", server_down=False)
