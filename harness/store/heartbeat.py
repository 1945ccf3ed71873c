"""The heartbeat of a run being written: a daemon thread that refreshes `runs.heartbeat_at` every
few seconds while a sweep measures, so a reader on another host can tell that the sweep is alive.

A thread rather than the level loop: one level of a large sweep runs for many minutes, longer than
the lease. A failed beat (the database briefly unreachable) is logged and retried at the next one; it
never stops the sweep. An in-memory SQLite store gets no thread: no other process can read it, and
another thread would see a different, empty database.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.engine import make_url

from k2bench.harness.store import db, liveness

log = logging.getLogger(__name__)


class Heartbeat:
    """``with Heartbeat(store, run_id):`` beats every ``interval_s`` (default liveness.HEARTBEAT_S)."""

    def __init__(self, store, run_id: int, interval_s: float | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.interval_s = liveness.HEARTBEAT_S if interval_s is None else interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def __enter__(self) -> Heartbeat:
        url = make_url(self.store.url)
        if url.get_backend_name() == "sqlite" and db.sqlite_path(url) is None:
            return self
        self._thread = threading.Thread(target=self._run, name=f"k2bench-heartbeat-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.store.beat(self.run_id)
            except Exception as exc:  # noqa: BLE001 - a missed beat must not end the sweep
                if not self._failing:
                    log.warning("run %s: heartbeat not written (%s); retrying every %g s", self.run_id, exc,
                                self.interval_s)
                self._failing = True
            else:
                self._failing = False
