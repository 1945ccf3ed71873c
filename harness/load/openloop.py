"""Open-loop sender: each request leaves at its scheduled time, whatever is still in flight.

A closed loop hides overload (a slower server simply gets fewer requests); an open loop keeps
offering load on a schedule (k2bench.harness.load.schedule, or any list of offsets such as a trace's
timestamps), so a server that cannot keep up shows it as growing latency. One dispatcher coroutine
walks the schedule, sleeps until each request's intended time and starts its stream
(loadgen.stream_one, same session and stamps as the closed loop). With ``max_inflight`` a request
due while the cap is full waits in a first-in-first-out client queue; the wait is recorded as its
``queue_ns``. Every record keeps ``intended_ns`` (schedule) beside ``send_ns`` (body written).

Level figures (``level_figures``): achieved rate, send lag and queue time, defined in docs/concepts.md.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from k2bench.errors import ServerError
from k2bench.harness.load.level_watch import STOP_POLL_S, LevelWatch
from k2bench.harness.load.loadgen import (
    LevelSpec,
    Session,
    level_url,
    make_session,
    request_body,
    send_one,
    with_endpoint,
)
from k2bench.harness.load.records import RequestRecord
from k2bench.workloads.prompts import Prompt

STOP_POLL_NS = int(STOP_POLL_S * 1e9)
START_LEAD_NS = 5_000_000  # the schedule starts 5 ms after the dispatcher does, so request 0 is not late by setup


def in_flight_cap(max_inflight: int | None, total: int) -> int:
    """What a rate level stores as its concurrency: the cap on requests in flight, or, with no cap,
    the level's request count (every request may be in flight at once)."""
    return max(1, max_inflight if max_inflight is not None else total)


async def send_on_schedule(session: Session, url: str, work: Sequence[tuple[bytes, RequestRecord]],
                           offsets_s: Sequence[float], timeout_s: float, watch: LevelWatch,
                           max_inflight: int | None = None,
                           on_done: Callable[[RequestRecord], None] | None = None,
                           on_first_measured: Callable[[], None] | None = None) -> None:
    """Send ``work[i]`` at ``offsets_s[i]`` seconds after the start; return when every sent request ended.

    ``on_first_measured`` runs (on the loop, so it must not block) just before the first request that is
    not warmup is released."""
    if len(work) != len(offsets_s):
        raise ValueError(f"{len(work)} requests but {len(offsets_s)} send times")
    slots = asyncio.Semaphore(max_inflight) if max_inflight is not None else None
    now = time.monotonic_ns
    start = now() + START_LEAD_NS
    tasks: list[asyncio.Task] = []
    watch._tasks = tasks  # a stop cancels whatever is in flight

    async def one(body: bytes, rec: RequestRecord) -> None:
        try:
            await send_one(session, url, body, rec, timeout_s, watch, on_done)
        finally:
            if slots is not None:
                slots.release()

    measured_started = False
    cap_free_at = 0  # when the dispatcher last got a slot after waiting for one
    for (body, rec), offset in zip(work, offsets_s, strict=True):
        intended = start + int(round(offset * 1e9))
        rec.intended_ns, rec.queue_ns = intended, 0
        wait = intended - now()
        while wait > STOP_POLL_NS and watch.stopped is None:  # a long gap: still see a stop within STOP_POLL_S
            await asyncio.sleep((wait - STOP_POLL_NS) / 1e9 if wait < 2 * STOP_POLL_NS else STOP_POLL_S)
            wait = intended - now()
        while wait > 0 and watch.stopped is None:  # uvloop's millisecond timers may wake a little early
            await asyncio.sleep(wait / 1e9)
            wait = intended - now()
        if slots is not None:
            # held from its intended time when it fell due while the dispatcher waited on the cap
            held_from = intended if intended < cap_free_at else now()
            full = slots.locked()
            await slots.acquire()
            if full:
                cap_free_at = now()
            rec.queue_ns = max(0, now() - held_from) if full or intended < cap_free_at else 0
        if watch.stopped is not None:
            if slots is not None:
                slots.release()
            break  # never sent: send_ns stays 0
        if not rec.warmup and not measured_started:
            measured_started = True
            if on_first_measured is not None:
                on_first_measured()
        tasks.append(asyncio.ensure_future(one(body, rec)))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:  # a stop cancels requests; anything else raised is a bug to show
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


async def run_rate_level(spec: LevelSpec, prompts: Sequence[Prompt], offsets_s: Sequence[float], rate: float,
                         num_warmup: int, max_inflight: int | None = None,
                         on_done: Callable[[RequestRecord], None] | None = None,
                         watch: LevelWatch | None = None,
                         on_window: tuple[Callable[[], None], Callable[[], None]] | None = None) -> list[RequestRecord]:
    """One rate level: request i is sent at ``offsets_s[i]``; the first ``num_warmup`` (the caller counts
    warmup and ramp-up requests there) are stored as warmup. Returns every record in schedule order
    (only the sent ones when ``watch`` stopped the level). ``on_window`` (start, end) brackets the
    measured requests: start is called in a worker thread when the first measured request is due,
    end once every request has finished."""
    spec = with_endpoint(spec, prompts)
    if not prompts:
        raise ValueError("no prompts")
    watch = watch or LevelWatch()
    url = level_url(spec)
    work: list[tuple[bytes, RequestRecord]] = []
    for i in range(len(offsets_s)):
        p = prompts[i % len(prompts)]
        rec = RequestRecord(index=i, concurrency=spec.concurrency, warmup=i < num_warmup,
                            requested_input_tokens=p.input_len, requested_output_tokens=p.output_len, send_ns=0,
                            mode="rate", rate=rate)
        work.append((request_body(spec.model, p, spec.extra_body), rec))
    deadline = None if watch.timeout_s is None else time.monotonic_ns() + int(watch.timeout_s * 1e9)
    watcher = asyncio.ensure_future(watch.watch(deadline))
    window: list[asyncio.Future] = []

    def begin() -> None:
        if on_window is not None:
            window.append(asyncio.ensure_future(asyncio.to_thread(on_window[0])))

    gc.collect()
    gc.disable()  # a collection pause would land in somebody's send lag and TTFT
    try:
        async with make_session(spec.timeout_s, spec.api_key, url) as session:
            await send_on_schedule(session, url, work, offsets_s, spec.timeout_s, watch, max_inflight,
                                   on_done, begin)
            if num_warmup and watch.stopped is None and not any(r.success for _, r in work[:num_warmup]):
                raise ServerError(f"every warmup request failed; first error: {work[0][1].error}")
    finally:
        gc.enable()
        watcher.cancel()
        if window:
            await window[0]
            await asyncio.to_thread(on_window[1])
    return [rec for _, rec in work if rec.send_ns]


def _ms_percentiles(values_ns: list[int]) -> tuple[float | None, float | None]:
    if not values_ns:
        return None, None
    p50, p99 = np.percentile(np.asarray(values_ns, dtype=np.float64) / 1e6, [50, 99])
    return float(p50), float(p99)


def send_lags_ns(records: Sequence[RequestRecord]) -> list[int]:
    """Per sent measured request: actual send - intended send - time held by the in-flight cap (the
    client's own lateness; a request the cap held back is late by design, counted as queue time)."""
    return [r.send_ns - r.intended_ns - (r.queue_ns or 0) for r in records
            if not r.warmup and r.send_ns and r.intended_ns is not None]


def scheduled_rate(records: Sequence[RequestRecord]) -> float | None:
    """Requests/s the measured part of the schedule asked for: (n - 1) / (last - first intended send)."""
    return _span_rate([r.intended_ns for r in records if not r.warmup and r.intended_ns is not None])


def _span_rate(stamps: list[int | None]) -> float | None:
    stamps = [t for t in stamps if t]
    if len(stamps) < 2:
        return None
    span = max(stamps) - min(stamps)
    return math.inf if span <= 0 else (len(stamps) - 1) / (span / 1e9)


def level_figures(records: Sequence[RequestRecord], rate: float) -> dict:
    """The rate-level fields of a point (schema.Point): mode, rate, achieved rate, send lag and queue time."""
    measured = [r for r in records if not r.warmup]
    lag50, lag99 = _ms_percentiles(send_lags_ns(records))
    q50, q99 = _ms_percentiles([r.queue_ns for r in measured if r.send_ns and r.queue_ns is not None])
    achieved = _span_rate([r.send_ns for r in measured])
    return {"mode": "rate", "rate": rate, "achieved_rate": None if achieved is None or math.isinf(achieved) else achieved,
            "send_lag_p50_ms": lag50, "send_lag_p99_ms": lag99, "queue_p50_ms": q50, "queue_p99_ms": q99}
