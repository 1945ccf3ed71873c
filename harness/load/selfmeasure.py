"""The client measuring itself: how busy its event loop was, and how late the loop ran callbacks.

A single-threaded event loop stamps each SSE message when it gets round to it. When the loop is busy
(parsing, the kernel's socket work, another request's callbacks) a chunk that has arrived waits, and
its stamp is late by that wait. Two figures show this over a level's measured window:

- CPU: the loop thread's user + system time (``time.thread_time``) over the window's wall time, the
  fraction of one core the loop used (``busy``). A loop cannot use more than one core.
- Demand: that plus the time the thread was ready to run but waiting for a core (the kernel's run-queue
  wait, /proc/thread-self/schedstat), over wall time (``demand``). On a machine shared with other work
  a saturated loop may get only part of a core: its CPU then reads low while it was never idle. Stored
  for reading; the saturation rule (k2bench.harness.measure.validity) judges CPU and lag, since on a
  shared machine demand mostly measures the neighbours. Where schedstat is missing, it is the CPU figure.
- Lag: a ticker asks to wake every TICK_S; how much later than asked it actually ran is what a chunk
  arriving at that moment would have waited. Its p50/p99 are stored; the p99 bounds the stamp error of
  all but 1% of messages. Lag also counts time the process was not scheduled at all (a busy machine).

Thread time, not process time: the loop thread is what saturates, and threads of the same process
(telemetry readers, a test server run in-process) must not count against it.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

import numpy as np

TICK_S = 0.005  # 200 wake-ups a second: about 0.2% of a core, and a lag sample every 5 ms
_TICK_NS = int(TICK_S * 1e9)
_SCHEDSTAT = "/proc/thread-self/schedstat"


def _runqueue_wait_s() -> float | None:
    """Seconds this thread has been ready to run but waiting for a core (None where Linux does not say)."""
    try:
        with open(_SCHEDSTAT) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class SelfMeter:
    """Started when a level's measured requests start and stopped when they end (``start``/``stop``
    inside the loop that sends them); ``result`` is then what one process measured."""

    result: dict | None = None
    _lags_ns: list[int] = field(default_factory=list)
    _task: asyncio.Task | None = None
    _cpu0: float = 0.0
    _wait0: float | None = None
    _wall0: int = 0

    def start(self) -> None:
        self._lags_ns.clear()
        self._cpu0, self._wait0, self._wall0 = time.thread_time(), _runqueue_wait_s(), time.monotonic_ns()
        self._task = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        lags, now, sleep = self._lags_ns, time.monotonic_ns, asyncio.sleep
        while True:
            due = now() + _TICK_NS
            await sleep(TICK_S)
            lags.append(max(now() - due, 0))

    def stop(self) -> dict:
        cpu, wall = time.thread_time() - self._cpu0, (time.monotonic_ns() - self._wall0) / 1e9
        wait_now = _runqueue_wait_s()
        wait = wait_now - self._wait0 if wait_now is not None and self._wait0 is not None else 0.0
        if self._task is not None:
            self._task.cancel()
            self._task = None
        lags = np.asarray(self._lags_ns, dtype=np.float64) / 1e6
        p50, p99 = (np.percentile(lags, [50, 99]) if lags.size else (0.0, 0.0))
        self.result = {"cpu_s": cpu, "wait_s": wait, "wall_s": wall, "busy": cpu / wall if wall > 0 else 0.0,
                       "demand": (cpu + wait) / wall if wall > 0 else 0.0,
                       "lag_p50_ms": float(p50), "lag_p99_ms": float(p99),
                       "lag_max_ms": float(lags.max()) if lags.size else 0.0, "lag_samples": int(lags.size)}
        return self.result


def cores_available() -> int:
    """Cores this process may run on (its CPU affinity), which its worker processes inherit."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def combine(parts: list[dict], cores: int | None = None) -> dict:
    """One level's client figures from each process's ``SelfMeter.result``.

    ``cpu_cores`` is the client's CPU as a fraction of one core (the sum over processes, so it may pass 1
    with several processes); ``cpu_share`` is that over the cores the client was given: one per process
    (a loop uses one core at most), no more than the ``cores`` it may run on. ``busy_max`` (the busiest
    loop's fraction of its core) and ``lag_p99_ms`` (the worst process's) are what the saturation rule
    judges: one saturated loop is enough to spoil the stamps of the requests it carries. ``demand_max``
    adds the run-queue wait."""
    cores = cores_available() if cores is None else cores
    cores_given = min(len(parts), cores)
    wall = max(p["wall_s"] for p in parts)
    cpu = sum(p["cpu_s"] for p in parts)
    used = cpu / wall if wall > 0 else 0.0
    return {
        "processes": len(parts), "cores_available": cores, "cores_given": cores_given, "cpu_s": cpu, "wall_s": wall,
        "cpu_cores": used, "cpu_share": used / cores_given,
        "busy_max": max(p["busy"] for p in parts), "demand_max": max(p["demand"] for p in parts),
        "lag_p50_ms": max(p["lag_p50_ms"] for p in parts), "lag_p99_ms": max(p["lag_p99_ms"] for p in parts),
        "lag_max_ms": max(p["lag_max_ms"] for p in parts), "lag_samples": sum(p["lag_samples"] for p in parts),
        "per_process": [{k: p[k] for k in ("cpu_s", "wait_s", "busy", "demand", "lag_p50_ms", "lag_p99_ms")}
                        for p in parts],
    }


def point_fields(client: dict | None) -> dict:
    """The level's stored client fields: the whole record and its flat figures."""
    if client is None:
        return {"client": None, "client_cpu": None, "client_cpu_share": None, "client_lag_p99_ms": None}
    return {"client": client, "client_cpu": client["cpu_cores"], "client_cpu_share": client["cpu_share"],
            "client_lag_p99_ms": client["lag_p99_ms"]}
