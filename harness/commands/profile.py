"""`k2bench profile-diff`: the kernels and ops whose time per step changed most between two runs'
profiles (sweep --profile-level)."""

from __future__ import annotations

import argparse

from k2bench.harness.commands.common import add_db_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile-diff", help="kernels whose time per step changed most between two profiled runs",
                       description="Compares the kernel-time summaries two runs keep from --profile-level: "
                                   "self time per engine step of each op or kernel, largest change first.")
    p.add_argument("run_a", metavar="RUN_A", help="the reference run (e.g. the last good commit's)")
    p.add_argument("run_b", metavar="RUN_B", help="the run compared with it")
    p.add_argument("--top", type=int, default=15, help="rows to show (default 15)")
    p.add_argument("--format", choices=["table", "md"], default="table")
    add_db_arg(p)
    p.set_defaults(handler=_profile_diff)


def _profile_diff(args: argparse.Namespace) -> int:
    from rich.table import Table
    from rich.text import Text

    from k2bench.errors import UserError
    from k2bench.harness.analysis import profile_diff
    from k2bench.harness.commands.common import table_console
    from k2bench.harness.store import Store

    if args.top < 1:
        raise UserError("--top must be at least 1")
    with Store.open(args.db, readonly=True) as store:
        a, b = store.get_run(args.run_a), store.get_run(args.run_b)
    rows = profile_diff.compare_runs(a, b, args.top)
    if args.format == "md":
        print(profile_diff.markdown(rows, f"run {a['id']}", f"run {b['id']}"))
        return 0
    table = Table(title=f"self time per engine step: run {a['id']} -> run {b['id']} "
                        f"({a['profile']['summary']['steps']} and {b['profile']['summary']['steps']} steps)",
                  title_justify="left")
    for head in ("op / kernel", "kind", f"run {a['id']} µs", f"run {b['id']} µs", "change µs", "ratio",
                 "calls/step A", "calls/step B"):
        table.add_column(head, justify="left" if head in ("op / kernel", "kind") else "right")
    for cells in profile_diff.text_rows(rows):
        table.add_row(*(Text(c) for c in cells))  # kernel names come from the server: never markup
    table_console().print(table)
    return 0
