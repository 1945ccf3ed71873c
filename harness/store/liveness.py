"""Is the process that writes a run still alive? Lets readers show a run left "running" by a
killed sweep as partial.

A writer is identified by host (hostname plus the kernel boot id, so two machines or two boots
with one hostname differ), pid, and the process start time (so a recycled pid is not mistaken
for the writer). Only a writer on this host can be judged; anything else reads as alive.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from pathlib import Path


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
