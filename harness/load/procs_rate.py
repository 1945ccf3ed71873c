"""A rate level's schedule shared by several client processes (``--client-procs``; the closed loop and the
machinery both share are in k2bench.harness.load.procs).

Request i of the schedule, in intended send order, goes to worker i mod N, so each worker sends every
N-th request of the one schedule. The parent picks one start on the shared clock (CLOCK_MONOTONIC) and
every worker sends at start + the request's offset, so each request's intended time is where the whole
schedule put it. A cap on requests in flight is split like a closed loop's concurrency.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from k2bench.errors import ServerError
from k2bench.harness.load import openloop
from k2bench.harness.load.level_watch import LevelWatch
from k2bench.harness.load.loadgen import LevelSpec, level_url, make_session, request_body, with_endpoint
from k2bench.harness.load.procs import _Pool, split_concurrency
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.load.selfmeasure import SelfMeter
from k2bench.workloads.prompts import Prompt


def split_schedule(n: int, procs: int) -> list[list[int]]:
    """Open loop: request i of the schedule (in intended send order) to worker i mod procs. Each worker
    then sends every procs-th request, so each carries the same rate and the same burstiness pattern
    thinned, and the whole schedule is sent exactly once, the same way on every rerun."""
    n_procs = max(1, min(procs, n))
    return [list(range(w, n, n_procs)) for w in range(n_procs)]


def _rate_worker_main(number: int, spec: LevelSpec, prompts: list, offsets: list[float], rate: float,
                      num_warmup: int, max_inflight: int | None, indices: list[int], results, control) -> None:
    """One worker of a rate level: its share of the schedule, sent from the parent's common start."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from k2bench.harness.load.loadgen import run

    try:
        run(_rate_worker(spec, prompts, offsets, rate, num_warmup, max_inflight, indices, results, control))
    except BaseException as exc:  # noqa: BLE001 - anything a worker hits is the parent's to report
        results.send(("error", f"{exc.__class__.__name__}: {exc}"))
    finally:
        results.close()


async def _rate_worker(spec: LevelSpec, prompts: list, offsets: list[float], rate: float, num_warmup: int,
                       max_inflight: int | None, indices: list[int], results, control) -> None:
    loop = asyncio.get_running_loop()
    watch = LevelWatch(connection_errors_to_stop=1 << 62)
    start = loop.create_future()
    url = level_url(spec)
    work = [(request_body(spec.model, p, spec.extra_body),
             RequestRecord(index=g, concurrency=spec.concurrency, warmup=j < num_warmup,
                           requested_input_tokens=p.input_len, requested_output_tokens=p.output_len, send_ns=0,
                           mode="rate", rate=rate))
            for j, (g, p) in enumerate(zip(indices, prompts, strict=True))]

    def on_control() -> None:
        try:
            msg = control.recv()
        except (EOFError, OSError):
            loop.remove_reader(control.fileno())
            msg = ("stop", "the client's parent process is gone")
        if msg[0] == "go" and not start.done():
            start.set_result(msg[1])
        elif msg[0] == "stop":
            watch.stop(msg[1], server_down=False)
            if not start.done():
                start.set_result(None)

    def on_done(rec: RequestRecord) -> None:
        results.send(("rec", rec))

    loop.add_reader(control.fileno(), on_control)
    meter = SelfMeter()  # a rate level's warmup and measured requests interleave: measured over the whole level
    gc.collect()
    gc.disable()
    try:
        async with make_session(spec.timeout_s, spec.api_key, url) as session:
            results.send(("warm",))  # ready: spawned, connected to nothing yet, listening
            start_ns = await start
            if start_ns is not None:
                meter.start()
                # the sender starts its schedule START_LEAD_NS after this call: shift it onto the common start
                shift = (time.monotonic_ns() + openloop.START_LEAD_NS - start_ns) / 1e9
                await openloop.send_on_schedule(session, url, work, [o - shift for o in offsets], spec.timeout_s,
                                                watch, max_inflight, on_done)
                meter.stop()
    finally:
        gc.enable()
        loop.remove_reader(control.fileno())
    # requests cut off in flight by a stop were not reported as done
    rest = [rec for _, rec in work if rec.send_ns and watch.stopped is not None and not rec.success]
    results.send(("done", rest, meter.result))


async def run_rate_level_procs(spec: LevelSpec, prompts: Sequence[Prompt], offsets_s: Sequence[float], rate: float,
                               num_warmup: int, max_inflight: int | None, procs: int,
                               on_done: Callable[[RequestRecord], None] | None = None,
                               watch: LevelWatch | None = None,
                               on_window: tuple[Callable[[], None], Callable[[], None]] | None = None,
                               ) -> tuple[list[RequestRecord], list[dict]]:
    """`openloop.run_rate_level` over ``procs`` worker processes (`split_schedule`), every worker sending on
    one common start, so each request's intended time is where the whole schedule put it. A cap on
    requests in flight is split like a closed loop's concurrency."""
    watch = watch or LevelWatch()
    parts = split_schedule(len(offsets_s), procs)
    caps = split_concurrency(max_inflight, len(parts)) if max_inflight is not None else [None] * len(parts)
    pool = _Pool(watch, on_done)
    deadline = None if watch.timeout_s is None else time.monotonic_ns() + int(watch.timeout_s * 1e9)
    watcher = asyncio.ensure_future(watch.watch(deadline))
    window = False
    try:
        args = []
        for i, (part, cap) in enumerate(zip(parts, caps, strict=True)):
            share = [prompts[g % len(prompts)] for g in part]
            warm = sum(1 for g in part if g < num_warmup)
            args.append((i, replace(spec, concurrency=cap or len(part)), share, [offsets_s[g] for g in part], rate,
                         warm, cap, part))
        pool.start(_rate_worker_main, args)
        await pool.until(lambda: all(w.warm or w.done for w in pool.workers))
        start_ns = time.monotonic_ns() + 50_000_000  # every worker has 50 ms to hear it
        pool.tell("go", start_ns)
        if watch.stopped is None and on_window is not None and num_warmup < len(offsets_s):
            # the measured window opens when the first measured request is due (seen within _POLL_S)
            due = start_ns + int(offsets_s[num_warmup] * 1e9)
            await pool.until(lambda: time.monotonic_ns() >= due or all(w.done for w in pool.workers))
            window = watch.stopped is None
            if window:
                await asyncio.to_thread(on_window[0])
        try:
            await pool.until(lambda: all(w.done for w in pool.workers))
        finally:
            if window:
                await asyncio.to_thread(on_window[1])
        warm = [r for r in pool.records.values() if r.warmup]
        if watch.stopped is None and warm and not any(r.success for r in warm):
            first = min(warm, key=lambda r: r.index)
            raise ServerError(f"every warmup request failed; first error: {first.error}")
    finally:
        watcher.cancel()
        pool.close()
    return pool.result()


async def rate_level(spec: LevelSpec, prompts: Sequence[Prompt], offsets_s: Sequence[float], rate: float,
                     num_warmup: int, max_inflight: int | None, procs: int,
                     on_done: Callable[[RequestRecord], None] | None = None, watch: LevelWatch | None = None,
                     on_window: tuple[Callable[[], None], Callable[[], None]] | None = None,
                     ) -> tuple[list[RequestRecord], list[dict]]:
    """A rate level in one process or several; the client is measured over the whole level (its warmup
    and measured requests interleave on the schedule)."""
    spec = with_endpoint(spec, prompts)
    if procs > 1:
        return await run_rate_level_procs(spec, prompts, offsets_s, rate, num_warmup, max_inflight, procs,
                                          on_done, watch, on_window)
    meter = SelfMeter()
    meter.start()
    try:
        records = await openloop.run_rate_level(spec, prompts, offsets_s, rate, num_warmup, max_inflight, on_done,
                                                watch, on_window)
    finally:
        meter.stop()
    return records, [meter.result]
