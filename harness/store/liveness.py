"""Is the process that writes a run still alive? Lets readers show a run left "running" by a
killed sweep as partial.

Two signals. On the writer's own host, the process itself: a writer is identified by host (hostname
plus the kernel boot id, so two machines or two boots with one hostname differ), pid, and the process
start time (so a recycled pid is not mistaken for the writer); this answers at once. From any host,
the run's heartbeat: a writing sweep refreshes `runs.heartbeat_at` every HEARTBEAT_S seconds
(store/heartbeat.py), and a heartbeat older than LEASE_S means the writer is gone. Both times are read
on the store's clock (the database server's, where it has one), so hosts with skewed clocks agree.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session

HEARTBEAT_S = 20.0  # how often a writing sweep refreshes its run's heartbeat
# Three missed beats, plus slack for a beat queued behind another writer's transaction (SQLite's busy
# timeout) or a stalled host: older than this, the writer is taken for dead.
LEASE_S = 3 * HEARTBEAT_S + 30.0


def store_now(s: Session) -> datetime:
    """The store's clock, naive UTC: the database server's time on PostgreSQL, so that writers and
    readers on different hosts compare heartbeats on one clock; this host's time for SQLite (a file has
    no clock of its own)."""
    if s.get_bind().dialect.name == "postgresql":
        return s.execute(text("SELECT CAST(now() AT TIME ZONE 'UTC' AS timestamp)")).scalar_one()
    return datetime.now(timezone.utc).replace(tzinfo=None)


def heartbeat_expired(heartbeat_at: datetime | None, now: datetime, lease_s: float = LEASE_S) -> bool:
    """True when a heartbeat is older than the lease; a run without one (written before heartbeats, or
    imported) is never judged by it."""
    return heartbeat_at is not None and now - heartbeat_at > timedelta(seconds=lease_s)


@lru_cache(maxsize=1)
def host_id() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = ""
    return f"{socket.gethostname()}#{boot}" if boot else socket.gethostname()


def process_start(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (Linux /proc), or None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the command name may contain spaces and ')'
    try:
        return int(fields[19])  # field 22 of stat; fields[0] here is field 3
    except (IndexError, ValueError):
        return None


def current_writer() -> tuple[str, int, int | None]:
    pid = os.getpid()
    return host_id(), pid, process_start(pid)


def writer_alive(host: str | None, pid: int | None, start: int | None) -> bool:
    if pid is None or host != host_id():
        return True  # imported, or written elsewhere: cannot tell, trust the record
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    except OSError:
        return False
    if start is not None:
        now = process_start(pid)
        if now is not None and now != start:
            return False  # the pid was recycled by another process
    return True
