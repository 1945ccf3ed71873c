"""How a `k2bench serve` process sets up its Python interpreter: the garbage collector's view of the
start-up heap, and counts of what stops every stream at once (collector pauses, Triton compiles).

A full collection walks every tracked object, and the heap of a serving process (torch, Triton, the
engine's start-up objects) holds hundreds of thousands: one pause of 100 ms or more, in the middle of a
measured run, for every stream at once. `freeze_heap` moves what exists once the server is warm into
the collector's permanent generation, so later collections walk only what serving allocates.

These are process-wide settings, so the CLI applies them to the process it owns; a test or a benchmark
that serves from inside another program leaves them alone unless it asks.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class ProcessSettings:
    """The serving process's interpreter settings, one place for their defaults (the CLI reads them)."""

    gc_freeze: bool = True  # gc.freeze() once the engine has warmed up

    def warmed(self, stalls: Stalls | None = None) -> None:
        """Once the engine has warmed up: freeze the heap if asked, and let `stalls` count from now on."""
        if self.gc_freeze:
            freeze_heap()
        if stalls is not None:
            stalls.ready()


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


class JitCompiles:
    """Counts and logs the Triton kernels compiled once the server is ready (exposed as
    k2bench_jit_compiles_total and k2bench_jit_compile_seconds_total).

    A kernel meets a new specialisation when an argument changes what Triton specialises on (an integer
    that becomes 1 or a multiple of 16, a pointer's 16-byte alignment, a dtype): it is compiled then, in
    the engine thread, while the GPU waits, from a few hundred milliseconds (found in Triton's disk
    cache) to seconds. Warm-up and CUDA graph capture compile what start-up can foresee; each compile
    after that is a stall for every stream, so it is logged with the kernel's signature. Without Triton
    `install` does nothing."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self._ready = False
        self._started: dict[str, float] = {}

    def install(self) -> JitCompiles:
        try:
            from triton import knobs
        except ImportError:  # no Triton (a CPU build of torch), or one without hooks
            return self
        rt = knobs.runtime
        before, after = rt.jit_cache_hook, rt.jit_post_compile_hook

        def start(*, key, **kw):
            self._started[str(key)] = time.perf_counter()
            return before(key=key, **kw) if before else None  # a true value would skip the compile

        def done(*, key, repr, **kw):
            t0 = self._started.pop(str(key), None)
            if self._ready and t0 is not None:
                dt = time.perf_counter() - t0
                self.count += 1
                self.seconds += dt
                log.warning("Triton compiled a kernel while serving (%.0f ms, every stream waited): %s", dt * 1e3, repr)
            return after(key=key, repr=repr, **kw) if after else None

        rt.jit_cache_hook, rt.jit_post_compile_hook = start, done
        return self

    def ready(self) -> None:
        """From now on compiles are counted (start-up's are expected)."""
        self._ready = True


class Stalls:
    """What stops every stream of a serving process at once: the collector's pauses and Triton's compiles
    (/metrics reports both). `install` once per process, before the engine is built."""

    def __init__(self) -> None:
        self.gc = GcPauses()
        self.jit = JitCompiles()

    def install(self) -> Stalls:
        self.gc.install()
        self.jit.install()
        return self

    def ready(self) -> None:
        """Serving starts: the longest pause starts afresh (start-up's, and the freeze's own collection, are
        not serving's), and compiles count from now on."""
        self.gc.longest = 0.0
        self.jit.ready()

