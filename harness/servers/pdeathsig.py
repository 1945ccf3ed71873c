"""A launched server must not outlive the sweep that started it, even a sweep killed with SIGKILL,
which runs no cleanup: on Linux the child asks the kernel (prctl PR_SET_PDEATHSIG) for SIGKILL when its
parent goes.

The kernel sends it when the *thread* that forked the child exits, not the process. So the request is
only made when the server is started from the main thread, which lives as long as the sweep; from any
other thread (which may end while the server should still run) the server relies on the normal
cleanup alone (launch.Server.stop at exit, on Ctrl-C, SIGTERM and errors).

It reaches the server's direct process only. Its own workers are in its process group, which the
normal cleanup stops; after a SIGKILL of the sweep they must watch their parent themselves (the
bundled engine's tensor-parallel ranks do; so do vLLM's and SGLang's workers).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A Popen ``preexec_fn`` that makes the child get ``sig`` when this thread exits, or None where
    that cannot be had (not Linux, not the main thread, no prctl)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent, sig = os.getpid(), int(sig)

    def preexec() -> None:  # runs in the child between fork and exec: no imports, no locks
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request was made: act on it now
            os.kill(os.getpid(), sig)

    return preexec
