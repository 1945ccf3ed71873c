"""What the CLI does with an exception nobody expected: a bug, not bad input.

Exit 1 means "a level was stored invalid" to CI scripts (ci/lib.sh carries on with it), and Python's
own exit for an uncaught exception is also 1. So a crash gets its own code, EX_SOFTWARE (70) from
sysexits.h, one line on stderr, and its traceback in a file, so the line stays readable in CI logs
while nothing is lost.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from datetime import datetime, timezone
from pathlib import Path

EXIT_CRASH = 70  # EX_SOFTWARE: an internal error, never a measurement outcome
CRASH_DIR_ENV = "K2BENCH_CRASH_DIR"  # where tracebacks go (default: the system's temporary folder)


def save_traceback(exc: BaseException) -> Path | None:
    """Write the exception's traceback to a new file, readable by its owner only; None if it cannot.

    The command line is left out: it may carry an API key or a database password."""
    folder = Path(os.environ.get(CRASH_DIR_ENV) or tempfile.gettempdir())
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"k2bench-crash-{stamp}-", suffix=".txt", dir=folder)
        with os.fdopen(fd, "w") as fh:
            fh.writelines(traceback.format_exception(exc))
    except OSError:
        return None
    return Path(name)


def report_crash(exc: BaseException, verbose: bool = False) -> int:
    """Print one line saying what broke and where its traceback is; return EXIT_CRASH.

    The traceback is printed too when it could not be saved, or with --verbose."""
    first = str(exc).strip().splitlines()
    what = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
    path = save_traceback(exc)
    where = f"traceback in {path}" if path else "traceback below"
    print(f"k2bench: internal error (exit {EXIT_CRASH}, a bug in k2bench, not in the input): {what}; {where}",
          file=sys.stderr)
    if path is None or verbose:
        traceback.print_exception(exc, file=sys.stderr)
    return EXIT_CRASH
