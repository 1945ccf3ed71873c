"""How many client processes a level gets (``--client-procs N|auto``).

``auto`` sizes each level from what the sweep knows: the expected token-message rate (the up-front
probe's decode step at that batch, else the last level's rate scaled by concurrency, an upper bound while
the server keeps up) times the client's CPU per message (measured by the last level) over AUTO_TARGET_BUSY
per process, between 1 and the cores (and the concurrency). With neither (the first level of a sweep too
small to probe) it uses one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from k2bench.harness.load.records import RequestRecord
from k2bench.harness.load.selfmeasure import cores_available

# `auto` sizes the client so that each loop stays about half busy: well under the saturation bound
# (--max-client-cpu, 0.9), with room for the bursts of a wave's start.
AUTO_TARGET_BUSY = 0.5
# client CPU per streamed token message before a level has measured it (bench/loadgen_bench.py, 2-core machine)
DEFAULT_US_PER_TOKEN = 25.0


def auto_procs(expected_tok_s: float | None, us_per_token: float | None, concurrency: int,
               cores: int | None = None) -> int:
    """``--client-procs auto``: enough processes for the expected token-message rate at the measured cost
    per token, each about AUTO_TARGET_BUSY busy; at least 1, at most the cores and the concurrency."""
    cores = cores_available() if cores is None else cores
    if not expected_tok_s or expected_tok_s <= 0:
        return 1
    cost = (us_per_token or DEFAULT_US_PER_TOKEN) * 1e-6
    need = math.ceil(expected_tok_s * cost / AUTO_TARGET_BUSY)
    return max(1, min(need, cores, concurrency))


class ClientSizer:
    """``--client-procs``: a fixed count, or ``auto``, which sizes each level from what the sweep knows:
    the expected token-message rate (the up-front probe's decode step at that batch, else the last
    level's rate scaled by concurrency, an upper bound while the server keeps up) and the last level's
    measured client CPU per message (see the module docstring)."""

    def __init__(self, setting: str, step_s: Callable[[int], float] | None = None) -> None:
        self.fixed = None if setting == "auto" else int(setting)
        self.step_s = step_s  # seconds of a decode step at a batch (the probe's), or None
        self.last: tuple[int, float, float] | None = None  # (concurrency, messages/s, us/message)
        self.us: float | None = None  # the last level's client CPU per message

    def procs_for(self, concurrency: int) -> int:
        if self.fixed is not None:
            return max(1, min(self.fixed, concurrency))
        rate, us = None, self.us
        if self.last is not None:
            conc, last_rate, _ = self.last
            rate = last_rate * concurrency / conc
        if self.step_s is not None:
            rate = concurrency / self.step_s(concurrency)
        return auto_procs(rate, us, concurrency)

    def procs_for_rate(self, rate: float, osl: int, requests: int) -> int:
        """A rate level's: its expected token-message rate is its request rate x the output length."""
        if self.fixed is not None:
            return max(1, min(self.fixed, requests))
        us = self.us
        expected = rate * osl if math.isfinite(rate) else None
        return auto_procs(expected, us, requests)

    def measured(self, concurrency: int | None, records: Sequence[RequestRecord], client: dict | None) -> None:
        """Learn from a finished level: its measured messages per second and client CPU per message
        (``concurrency`` None: a rate level, whose cost per message is kept but whose rate does not scale
        with a concurrency)."""
        done = [r for r in records if not r.warmup and r.end_ns is not None and r.send_ns]
        messages = sum(len(r.token_ns) for r in done)
        if not done or not messages or client is None:
            return
        span = (max(r.end_ns for r in done) - min(r.send_ns for r in done)) / 1e9
        if span > 0:
            self.us = client["us_per_message"] = client["cpu_s"] * 1e6 / messages
            if concurrency is not None:
                self.last = (concurrency, messages / span, self.us)

