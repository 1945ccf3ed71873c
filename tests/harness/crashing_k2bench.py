"""`k2bench` whose sweep crashes after storing its run (a stand-in for a bug in the final report), for
tests that need a crash in a separate process, as CI scripts see one. Not a test module."""

from __future__ import annotations

import sys

from k2bench.harness.cli import main
from k2bench.harness.commands import sweep_output


def _broken_report(*args, **kwargs) -> None:
    raise RuntimeError("[bold]report broke[/bold] after the run was stored")


if __name__ == "__main__":
    sweep_output.report = _broken_report
    sys.exit(main())
