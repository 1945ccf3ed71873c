"""The event loop the client and `k2bench serve` run on: uvloop where it is installed, asyncio's otherwise.

uvloop's transports write to sockets from C, so a streaming server or client spends less of its one
thread (and, in `k2bench serve`, of the GIL it shares with the engine thread) per message.
K2BENCH_NO_UVLOOP=1 selects asyncio's own loop everywhere.
"""

from __future__ import annotations

import asyncio
import os
import sys

try:
    import uvloop as _uvloop
except ImportError:  # pragma: no cover - depends on the environment
    _uvloop = None

NO_UVLOOP_ENV = "K2BENCH_NO_UVLOOP"


def use_uvloop() -> bool:
    return _uvloop is not None and sys.version_info >= (3, 11) and os.environ.get(NO_UVLOOP_ENV) != "1"


def event_loop_name() -> str:
    return "uvloop" if use_uvloop() else "asyncio"


def run(coro):
    """Run a coroutine to completion on the loop `event_loop_name` names."""
    if use_uvloop():
        with asyncio.Runner(loop_factory=_uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)
