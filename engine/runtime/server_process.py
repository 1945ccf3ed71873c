"""How a `k2bench serve` process sets up its Python interpreter: the garbage collector's view of the
start-up heap, and a count of its pauses.

A full collection walks every tracked object, and the heap of a serving process (torch, Triton, the
engine's start-up objects) holds hundreds of thousands: one pause of 100 ms or more, in the middle of a
measured run, for every stream at once. `freeze_heap` moves what exists once the server is warm into
the collector's permanent generation, so later collections walk only what serving allocates.

These are process-wide settings, so the CLI applies them to the process it owns; a test or a benchmark
that serves from inside another program leaves them alone unless it asks.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass


@dataclass
class ProcessSettings:
    """The serving process's interpreter settings, one place for their defaults (the CLI reads them)."""

    gc_freeze: bool = True  # gc.freeze() once the engine has warmed up

    def warmed(self, pauses: GcPauses | None = None) -> None:
        """Once the engine has warmed up: freeze the heap if asked, and start `pauses`' longest pause
        afresh, so that it tells of serving rather than of start-up (or of the freeze's own collection)."""
        if self.gc_freeze:
            freeze_heap()
        if pauses is not None:
            pauses.longest = 0.0


def freeze_heap() -> int:
    """Collect what start-up left behind, then exclude everything alive from later collections; returns
    how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """Counts the garbage collector's pauses and their seconds, per generation, through `gc.callbacks`
    (exposed as k2bench_gc_pauses_total and k2bench_gc_pause_seconds_total). `install` once per process;
    `uninstall` removes the callback."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = 0.0
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        dt = time.perf_counter() - self._t0
        g = info.get("generation", 2)
        self.count[g] += 1
        self.seconds[g] += dt
        self.longest = max(self.longest, dt)

    def install(self) -> GcPauses:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
