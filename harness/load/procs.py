"""A level's requests shared by several client processes (``--client-procs``), merged exactly.

One event loop on one core carries a limited number of streamed tokens a second (bench/loadgen_bench.py
measures the cost per token); past that, the client's clock sets the numbers. Here each of N worker
processes runs its own event loop, its own connections and its own share of the level through the same
code as a single process (loadgen.run_work), and sends every finished request's raw record back as it
finishes. The parent keeps the level's rules in one place: progress and stop rules see each record as it
arrives (LevelWatch), the telemetry window opens once every worker's warmup is done and before any
measured request is sent, and a stop is passed on to every worker.

Merging is exact because every process stamps with ``time.monotonic_ns()``, which on Linux reads
CLOCK_MONOTONIC: one clock for the whole machine, not per process (its zero is the boot, the same for
all), so stamps of different processes are directly comparable; tests/harness/test_procs.py checks it.

Closed loop: the concurrency is split as evenly as it goes (shares differ by at most one), and request j
of each phase (warmup, measured) goes to the worker that owns slot j mod concurrency, so each worker gets
its share of the requests in order. Rate levels: k2bench.harness.load.procs_rate. A worker that dies stops the level with the reason: its unfinished
requests are never silently dropped from a level that then looks complete.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from k2bench.errors import ServerError
from k2bench.harness.load.level_watch import LevelWatch
from k2bench.harness.load.loadgen import (
    LevelSpec,
    build_work,
    run_level,
    run_work,
    with_endpoint,
)
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.load.selfmeasure import SelfMeter
from k2bench.workloads.prompts import Prompt

_POLL_S = 0.05  # how often the parent looks at the watch while waiting for workers


def split_concurrency(concurrency: int, procs: int) -> list[int]:
    """Each worker's share of the concurrency: as even as it goes, never zero (at most one worker a slot)."""
    n = max(1, min(procs, concurrency))
    return [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]


def slot_owners(shares: Sequence[int]) -> list[int]:
    """The worker of each slot 0..concurrency-1: worker i owns shares[i] consecutive slots."""
    return [i for i, share in enumerate(shares) for _ in range(share)]


def assign(work: Sequence[tuple[bytes, RequestRecord]], shares: Sequence[int]) -> list[list]:
    """Each worker's requests: the j-th request of each phase to the owner of slot j mod concurrency."""
    owners = slot_owners(shares)
    out: list[list] = [[] for _ in shares]
    for phase in (True, False):
        for j, item in enumerate(w for w in work if w[1].warmup is phase):
            out[owners[j % len(owners)]].append(item)
    return out


# ---------------------------------------------------------------- the worker


def _worker_main(number: int, spec: LevelSpec, work: list, results, control) -> None:
    """One worker process: run its share, sending each finished record, then ("done", rest, meter)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends its workers
    from k2bench.harness.load.loadgen import run

    try:
        run(_worker(spec, work, results, control))
    except BaseException as exc:  # noqa: BLE001 - anything a worker hits is the parent's to report
        results.send(("error", f"{exc.__class__.__name__}: {exc}"))
    finally:
        results.close()


async def _worker(spec: LevelSpec, work: list, results, control) -> None:
    loop = asyncio.get_running_loop()
    # stop on the parent's word only: the parent sees every record and judges connection errors itself
    watch = LevelWatch(connection_errors_to_stop=1 << 62)
    go = threading.Event()
    reported: set[int] = set()

    def on_control() -> None:
        try:
            msg = control.recv()
        except (EOFError, OSError):  # the parent is gone: stop, and stop listening
            loop.remove_reader(control.fileno())
            msg = ("stop", "the client's parent process is gone")
        if msg[0] == "go":
            go.set()
        elif msg[0] == "stop":
            watch.stop(msg[1], server_down=False)
            go.set()

    def on_done(rec: RequestRecord) -> None:
        reported.add(rec.index)
        results.send(("rec", rec))

    def warm_done() -> None:  # run in a thread by run_work: tell the parent, wait for its word
        results.send(("warm",))
        go.wait()

    loop.add_reader(control.fileno(), on_control)
    meter = SelfMeter()
    records = await run_work(spec, work, on_done, watch, (warm_done, lambda: None), meter, check_warmup=False)
    loop.remove_reader(control.fileno())
    rest = [r for r in records if r.index not in reported]
    results.send(("done", rest, meter.result))


# ---------------------------------------------------------------- the parent


class _Worker:
    def __init__(self, number: int, proc, results, control) -> None:
        self.number, self.proc, self.results, self.control = number, proc, results, control
        self.warm = self.done = False
        self.meter: dict | None = None
        self.error: str | None = None

    def tell(self, *msg) -> None:
        try:
            self.control.send(msg)
        except (OSError, ValueError):  # it is gone; its death is reported where it is seen
            pass


class _Pool:
    """The parent's side of one level's workers: records as they arrive (progress and stop rules see each),
    a stop passed on to every worker, a dead worker noticed, and every process ended on the way out."""

    def __init__(self, watch: LevelWatch, on_done: Callable[[RequestRecord], None] | None) -> None:
        self.watch, self.on_done = watch, on_done
        self.loop = asyncio.get_running_loop()
        self.woke = asyncio.Event()
        self.records: dict[int, RequestRecord] = {}
        self.workers: list[_Worker] = []
        self.stop_sent = False

    def start(self, target: Callable, args: list[tuple]) -> None:
        ctx = mp.get_context("spawn")  # no fork of a process that may hold threads (telemetry)
        for i, extra in enumerate(args):
            results_r, results_w = ctx.Pipe(duplex=False)
            control_r, control_w = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=target, args=(*extra, results_w, control_r), name=f"k2bench-client-{i + 1}",
                               daemon=True)
            proc.start()
            results_w.close()
            control_r.close()
            w = _Worker(i, proc, results_r, control_w)
            self.workers.append(w)
            self.loop.add_reader(results_r.fileno(), self._on_message, w)

    def _on_message(self, w: _Worker) -> None:
        try:
            while w.results.poll():
                msg = w.results.recv()
                if msg[0] == "rec":
                    rec = msg[1]
                    self.records[rec.index] = rec
                    self.watch.finished(rec)
                    if self.on_done is not None:
                        self.on_done(rec)
                elif msg[0] == "warm":
                    w.warm = True
                elif msg[0] == "done":
                    for rec in msg[1]:
                        self.records[rec.index] = rec
                    w.meter, w.done = msg[2], True
                elif msg[0] == "error":
                    w.error, w.done = msg[1], True
        except (EOFError, OSError):
            self.loop.remove_reader(w.results.fileno())
            if not w.done:
                w.proc.join(1.0)
                code = w.proc.exitcode
                how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                w.error, w.done = f"client process {w.number + 1} of {len(self.workers)} died ({how})", True
        self.woke.set()

    def tell(self, *msg) -> None:
        for w in self.workers:
            w.tell(*msg)

    async def until(self, ready: Callable[[], bool]) -> None:
        """Wait for ``ready``, passing a stop (the watch's, or a dead worker's) on to every worker."""
        while True:
            failed = next((w for w in self.workers if w.error), None)
            if failed is not None and self.watch.stopped is None:
                self.watch.stop(failed.error, server_down=False)
            if self.watch.stopped is not None and not self.stop_sent:
                self.stop_sent = True
                self.tell("stop", self.watch.stopped)
            if ready():
                return
            self.woke.clear()
            try:
                await asyncio.wait_for(self.woke.wait(), _POLL_S)
            except asyncio.TimeoutError:
                pass

    def close(self) -> None:
        for w in self.workers:
            if not w.results.closed:
                self.loop.remove_reader(w.results.fileno())
            w.proc.join(5.0 if w.done else 0.0)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
            w.results.close()
            w.control.close()

    def result(self) -> tuple[list[RequestRecord], list[dict]]:
        out = sorted(self.records.values(), key=lambda r: r.index)
        if self.watch.stopped is not None:
            out = [r for r in out if r.send_ns]
        return out, [w.meter for w in self.workers if w.meter is not None]


async def run_level_procs(spec: LevelSpec, prompts: Sequence[Prompt], procs: int,
                          on_done: Callable[[RequestRecord], None] | None = None,
                          watch: LevelWatch | None = None,
                          on_window: tuple[Callable[[], None], Callable[[], None]] | None = None,
                          ) -> tuple[list[RequestRecord], list[dict]]:
    """`loadgen.run_level` over ``procs`` worker processes: (records in index order, each worker's
    SelfMeter result). Raises ServerError when every warmup request failed, as run_level does."""
    watch = watch or LevelWatch()
    shares = split_concurrency(spec.concurrency, procs)
    parts = assign(build_work(spec, prompts), shares)
    pool = _Pool(watch, on_done)
    deadline = None if watch.timeout_s is None else time.monotonic_ns() + int(watch.timeout_s * 1e9)
    watcher = asyncio.ensure_future(watch.watch(deadline))
    try:
        pool.start(_worker_main, [(i, replace(spec, concurrency=share), part)
                                  for i, (share, part) in enumerate(zip(shares, parts, strict=True))])
        await pool.until(lambda: all(w.warm or w.done for w in pool.workers))
        warm = [r for r in pool.records.values() if r.warmup]
        if watch.stopped is None and warm and not any(r.success for r in warm):
            pool.tell("stop", "every warmup request failed")
            first = min(warm, key=lambda r: r.index)
            raise ServerError(f"every warmup request failed; first error: {first.error}")
        window = watch.stopped is None and on_window is not None
        if window:
            await asyncio.to_thread(on_window[0])
        pool.tell("go")
        try:
            await pool.until(lambda: all(w.done for w in pool.workers))
        finally:
            if window:
                await asyncio.to_thread(on_window[1])
    finally:
        watcher.cancel()
        pool.close()
    return pool.result()


async def closed_level(spec: LevelSpec, prompts: Sequence[Prompt], procs: int,
                       on_done: Callable[[RequestRecord], None] | None = None, watch: LevelWatch | None = None,
                       on_window: tuple[Callable[[], None], Callable[[], None]] | None = None,
                       ) -> tuple[list[RequestRecord], list[dict]]:
    """A closed level in one process or several: (records, each process's SelfMeter result)."""
    spec = with_endpoint(spec, prompts)
    if procs > 1:
        return await run_level_procs(spec, prompts, procs, on_done, watch, on_window)
    meter = SelfMeter()
    records = await run_level(spec, prompts, on_done, watch, on_window, meter)
    return records, [meter.result] if meter.result else []
