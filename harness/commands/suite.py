"""`k2bench suite list|run|matrix|submit FILE`: a benchmark matrix here, on GitHub Actions, or on Slurm."""

from __future__ import annotations

import argparse
import os

from k2bench.harness.commands.common import add_db_arg
from k2bench.harness.plan import settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("suite", help="a benchmark matrix (suites/*.toml): list, run, matrix, submit",
                       description="Expand a suite file into jobs (one server configuration each) and run "
                                   "them here, or hand them to GitHub Actions or Slurm.")
    actions = p.add_subparsers(dest="suite_action", metavar="ACTION", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help_text, description=help_text)
        a.add_argument("file", help="suite TOML file, e.g. suites/cpu-smoke.toml")
        a.add_argument("--only", action="append", metavar="KEY=VALUE",
                       help="keep jobs whose KEY (id or any job field) equals VALUE (repeatable; all must hold)")
        return a

    ls = add("list", "print the expanded jobs and their ids")
    ls.set_defaults(handler=_list)

    run = add("run", "run the jobs sequentially on this machine, skipping jobs stored for this commit")
    _run_args(run)
    run.set_defaults(handler=_run)

    mx = add("matrix", "print the jobs as a CI matrix")
    mx.add_argument("--format", choices=("github",), default="github",
                    help="github: JSON for strategy.matrix (one include entry per job)")
    mx.add_argument("--default-label", default="gpu", help="runner label of jobs without hardware (default gpu)")
    mx.set_defaults(handler=_matrix)

    sb = add("submit", "submit the jobs to a scheduler (one task per job)")
    sb.add_argument("--slurm", action="store_true", required=True, help="as a Slurm job array (sbatch)")
    sb.add_argument("--partition", help="Slurm partition")
    sb.add_argument("--time", dest="time_limit", help="Slurm time limit per task, e.g. 02:00:00")
    sb.add_argument("--gpus-per-task", type=int, default=None, help="Slurm --gpus-per-task")
    sb.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                    help="one more sbatch argument, e.g. --sbatch-arg=--account=perf (repeatable)")
    sb.add_argument("--wait", action="store_true", help="block until every task has ended; exit 1 if one failed")
    sb.add_argument("--out", default="results/slurm", help="folder for the batch script and task logs")
    add_db_arg(sb)  # the database every task writes to
    sb.set_defaults(handler=_submit)


def _run_args(p: argparse.ArgumentParser) -> None:
    """What a suite file leaves to the command line (the database, and what is recorded)."""
    settings.add_flags(p, settings.SUITE_RUN, extra={"recording": add_db_arg})


def _list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from k2bench.harness.plan import suites

    suite = suites.load(args.file)
    jobs = suite.select(args.only)
    keys = [k for k in suites.FIELDS if any(k in j.fields for j in jobs)]
    table = Table(title=f"suite {suite.name}: {len(jobs)} job(s)")
    table.add_column("id", overflow="fold")
    for k in keys:
        table.add_column(k, overflow="fold")
    for j in jobs:
        table.add_row(j.id, *(suites._text(j.fields[k]) if k in j.fields else "" for k in keys))
    Console(width=200).print(table)
    return 0


def _run(args: argparse.Namespace) -> int:
    from k2bench.harness.plan import suites
    from k2bench.harness.run import jobrun
    from k2bench.harness.run.sweep import SweepConfig

    suite = suites.load(args.file)
    jobs = suite.select(args.only)
    base = SweepConfig.from_settings(settings.from_args(args, settings.SUITE_RUN), db=args.db)
    outcomes = jobrun.run_suite(suite, jobs, base, say=lambda text: print(text, flush=True))
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    print(f"suite {suite.name}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return 1 if any(o.status in ("failed", "partial") for o in outcomes) else 0


def _matrix(args: argparse.Namespace) -> int:
    from k2bench.harness.plan import suites
    from k2bench.harness.run import fleet

    suite = suites.load(args.file)
    print(fleet.matrix_json(suite.select(args.only), args.default_label))
    return 0


def _submit(args: argparse.Namespace) -> int:
    from k2bench.harness.plan import suites
    from k2bench.harness.run import fleet

    suite = suites.load(args.file)
    jobs = suite.select(args.only)
    sub = fleet.submit_slurm(suite, jobs, db=args.db or os.environ.get("K2BENCH_DB"), partition=args.partition,
                             time_limit=args.time_limit, gpus_per_task=args.gpus_per_task,
                             sbatch_args=args.sbatch_arg, wait=args.wait, out_dir=args.out)
    print(f"submitted Slurm array {sub.job_id} ({sub.tasks} task(s)); script and logs in {sub.script.parent}")
    if args.wait:
        print(f"array {sub.job_id} ended: " + ("every task succeeded" if sub.exit_code == 0
                                               else f"highest task exit code {sub.exit_code}"))
        return 0 if sub.exit_code == 0 else 1
    return 0
