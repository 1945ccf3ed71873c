"""What one level of a sweep sends, by kind of workload: prompts under the closed loop (random, dataset,
shared prefix), sessions (conversations), or a trace's requests at the trace's times (one open-loop level
whose rate is the trace's mean rate: requests - 1 over the span of its scaled timestamps).

Shared-prefix workloads run prime-then-measure: the warmup holds at least one request of every prefix
group (request i belongs to group i mod prefix_groups, so the first prefix_groups requests cover them),
so the measured requests find their group's prefix cached and the level's hit rate is that of a primed cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from k2bench.harness.load.level_watch import LevelWatch
from k2bench.harness.load.loadgen import LevelSpec, run_level
from k2bench.harness.load.records import RequestRecord
from k2bench.workloads.build import level_prompts
from k2bench.workloads.loader import Workload


@dataclass
class LevelWork:
    """A level's requests, ready to send: ``planned`` measured requests after ``warmup`` ones."""

    workload: Workload
    planned: int
    warmup: int
    prompts: list | None = None  # closed loop and traces
    sessions: list | None = None  # conversations (warmup and planned count turns)

    @property
    def total(self) -> int:
        return self.planned + self.warmup

    def level(self, spec: LevelSpec, on_done: Callable[[RequestRecord], None] | None, watch: LevelWatch,
              on_window: tuple[Callable[[], None], Callable[[], None]]) -> Coroutine[Any, Any, list[RequestRecord]]:
        """The level to run (with `loadgen.run`): the closed loop over prompts, or over sessions."""
        if self.sessions is not None:
            from k2bench.harness.load.sessions import run_sessions

            warm_sessions = self.warmup // self.workload.turns
            return run_sessions(spec, self.sessions, warm_sessions, self.workload.think_time_s, on_done, watch,
                                on_window)
        return run_level(spec, self.prompts or [], on_done, watch, on_window=on_window)


def plan(w: Workload, n: int, warm: int, *, url: str, model: str, vocab, seed: int) -> LevelWork:
    """The requests of a level of ``n`` measured and ``warm`` warmup requests (conversations round both up to
    whole sessions; a prefix workload's warmup covers every group)."""
    if w.turns > 1:
        from k2bench.workloads.build import sessions

        count, warm_count = math.ceil(n / w.turns), math.ceil(warm / w.turns)
        got = sessions(w, count + warm_count, base_url=url, model=model, vocab=vocab, seed=seed)
        return LevelWork(w, planned=count * w.turns, warmup=warm_count * w.turns, sessions=got)
    if w.prefix_len:
        warm = max(warm, w.prefix_groups)
    # one distinct prompt per request, warmup included: a server with prefix caching must not get measured
    # requests it has already seen (a prefix workload shares only its groups' prefixes)
    got = level_prompts(w, n + warm, base_url=url, model=model, vocab=vocab, seed=seed)
    return LevelWork(w, planned=n, warmup=warm, prompts=got)


def trace_prompts(w: Workload, vocab) -> list:
    from k2bench.workloads.build import trace_prompts as build_trace

    return build_trace(w, vocab)


def trace_offsets(w: Workload) -> list[float]:
    """Each request's send time, seconds after the first (the trace's gaps x its time scale)."""
    from k2bench.workloads.trace import read_trace, send_offsets_s

    return send_offsets_s(read_trace(w.path or ""), w.time_scale)


def trace_rate(w: Workload) -> float:
    """The trace's mean rate in requests/s at its time scale (inf when every request has one timestamp)."""
    offsets = trace_offsets(w)
    return (len(offsets) - 1) / offsets[-1] if offsets[-1] > 0 else math.inf
