"""`k2bench backfill` and `k2bench bisect`: a repository's commits measured into the history, and the
first commit that got worse. Both launch ``--server-cmd`` from each commit's own git worktree."""

from __future__ import annotations

import argparse

from k2bench.harness.commands.common import add_db_arg
from k2bench.harness.plan import settings


def _common(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--repo", required=True, help="the git repository whose commits are measured")
    p.add_argument("--setup", help="shell command run in each worktree before the server (e.g. pip install -e .)")
    settings.add_flags(p, command, extra={"recording": add_db_arg})


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("backfill", help="measure each commit of a range from its own worktree",
                       description="For each commit of REV_RANGE (git log syntax, e.g. v1.0..main): a worktree, "
                                   "--setup, --server-cmd, a sweep stored with the commit's sha and branch. "
                                   "Commits stored with the same configuration are skipped; failures are "
                                   "stored as failed runs and the backfill goes on.")
    b.add_argument("rev_range", metavar="REV_RANGE")
    b.add_argument("--every", type=int, default=1, help="every Nth commit (the newest always)")
    _common(b, settings.BACKFILL)
    b.set_defaults(handler=_backfill)

    s = sub.add_parser("bisect", help="find the first commit whose metric got worse (significance-aware)",
                       description="Confirms that --bad is worse than --good in --metric at --conc with the "
                                   "gate's rule (threshold and significance), then bisects; inconclusive commits "
                                   "are measured again, stored runs are reused. Exit 0 with the first bad commit, "
                                   "1 when there is none.")
    s.add_argument("--good", help="a commit where the metric is fine")
    s.add_argument("--bad", help="a later commit where it is worse")
    s.add_argument("--metric", "--gate-metric", dest="metric", metavar="NAME",
                   help="the metric that decides good from bad: any catalogue metric, e.g. tpot_ms_median, "
                        "steady_tput_per_gpu (--gate-metric is the same flag, as regress and changepoints spell it; "
                        "bisect takes exactly one)")
    s.add_argument("--shifts", metavar="BRANCH", default=None,
                   help="instead of --good/--bad/--metric: bisect every stored change point of BRANCH that lies "
                        "between two non-adjacent stored commits (the nightly scan's follow-up); writes one "
                        "JSON per shift and culprits.md into --out-dir")
    s.add_argument("--out-dir", default="results/bisect", help="with --shifts: where the reports go")
    s.add_argument("--at-conc", dest="at_conc", type=int, default=None,
                   help="concurrency the metric is read at (default: the only --conc level)")
    s.add_argument("--threshold", type=float, default=0.05, help="relative change that matters (default 0.05)")
    s.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")
    s.add_argument("--max-remeasure", type=int, default=2, help="re-measurements of an inconclusive commit")
    s.add_argument("--json", dest="bisect_json", metavar="PATH", help="write k2bench.bisect/1 JSON")
    _common(s, settings.BISECT)
    s.set_defaults(handler=_bisect)


def _bench(args: argparse.Namespace):
    from k2bench.errors import UserError
    from k2bench.harness.history import gitrepo
    from k2bench.harness.history.backfill import CommitBench
    from k2bench.harness.run.sweep import SweepConfig

    given = settings.from_args(args, args.command)
    server_cmd = given.pop("server_cmd", None)  # the bench launches it per commit; the sweep attaches
    if not server_cmd:
        raise UserError(f"{args.command} needs --server-cmd: the server command run in each commit's worktree")
    cfg = SweepConfig.from_settings(given, db=args.db)
    from k2bench.harness.servers.recipes import custom

    custom(server_cmd)  # a bad command fails here, before any worktree is made
    return CommitBench(repo=gitrepo.check_repo(args.repo), server_cmd=server_cmd, cfg=cfg, setup=args.setup,
                       say=lambda text: print(text, flush=True))


def _backfill(args: argparse.Namespace) -> int:
    from k2bench.harness.history import gitrepo
    from k2bench.harness.history.backfill import backfill

    bench = _bench(args)
    commits = gitrepo.commits(bench.repo, args.rev_range, args.every)
    lines = backfill(bench, commits)
    counts: dict[str, int] = {}
    for line in lines:
        counts[line.status] = counts.get(line.status, 0) + 1
    print(f"backfill of {len(lines)} commit(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return 1 if counts.get("failed") or counts.get("partial") else 0


def _bisect(args: argparse.Namespace) -> int:
    from k2bench.errors import UserError
    from k2bench.harness.analysis.regress import RegressConfig
    from k2bench.harness.history.bisect import Bisector, record, write_json
    from k2bench.harness.history.gitrepo import branch_of

    if args.shifts:
        return _bisect_shifts(args)
    missing = [f"--{n}" for n in ("good", "bad", "metric") if getattr(args, n) is None]
    if missing:
        raise UserError(f"bisect needs {', '.join(missing)} (or --shifts BRANCH)")
    bench = _bench(args)
    conc = args.at_conc
    if conc is None:
        if len(bench.cfg.levels) != 1:
            raise UserError("--conc gives several levels: say which one the metric is read at with --at-conc")
        conc = bench.cfg.levels[0]
    try:
        config = RegressConfig(threshold=args.threshold, alpha=args.alpha)
        config.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    result = Bisector(bench, args.metric, conc, config, max_remeasure=args.max_remeasure).run(args.good, args.bad)
    good, bad = result.steps[0].commit.sha, result.steps[1].commit.sha
    record(bench.cfg.db, fingerprint=bench.fingerprint, branch=bench.cfg.branch or branch_of(bench.repo, bad),
           metric=args.metric, concurrency=conc, good=good, bad=bad, result=result)
    for step in result.steps:
        print(f"  {step.commit.short}  {step.commit.date}  {args.metric} = {step.value:.4g}  {step.verdict}"
              f"  {step.commit.subject[:60]}")
    print(result.message)
    if result.profile_section:
        print(result.profile_section)
    print(f"{result.measured} commit(s) measured by this call")
    if args.bisect_json:
        write_json(result, args.bisect_json)
    return 0 if result.first_bad else 1


def _bisect_shifts(args: argparse.Namespace) -> int:
    """Every stored shift between non-adjacent commits, bisected with the shifted run's own workload."""
    from functools import partial
    from pathlib import Path

    from k2bench.harness.analysis.mdsafe import md_code, md_text
    from k2bench.harness.analysis.regress import RegressConfig
    from k2bench.harness.history.bisect import Bisector, record, write_json
    from k2bench.harness.history.shifts import find_shifts
    from k2bench.harness.store import Store

    bench = _bench(args)
    with Store.open(args.db, readonly=True) as store:
        shifts = find_shifts(store, bench.repo, args.shifts)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| metric | conc | last good | first bad | culprit |", "| --- | --- | --- | --- | --- |"]
    profiles: list[str] = []  # where a culprit's time went, when both sides were profiled
    if not shifts:
        print(f"no stored change point on {args.shifts} to bisect")
    for shift in shifts:
        label = f"{shift.metric} at concurrency {shift.concurrency}: {shift.good[:12]}..{shift.bad[:12]}"
        where = {"fingerprint": shift.fingerprint, "branch": args.shifts, "metric": shift.metric,
                 "concurrency": shift.concurrency, "good": shift.good, "bad": shift.bad}
        if shift.adjacent:
            culprit = shift.bad
            print(f"{label}: adjacent commits, so the culprit is {culprit}")
            record(args.db, **where, result=None)
            if bench.cfg.profile_level:  # profile both sides of the confirmed change
                from k2bench.harness.history.gitrepo import resolve

                one = _one_shift(bench, shift)
                section, _ = Bisector(one, shift.metric, shift.concurrency).profile_pair(
                    resolve(bench.repo, shift.good), resolve(bench.repo, shift.bad))
                if section:
                    profiles.append(f"## {md_text(label)}\n\n{section}")
        else:
            one = _one_shift(bench, shift)
            print(f"{label}: bisecting {shift.between} commit(s)")
            result = Bisector(one, shift.metric, shift.concurrency,
                              RegressConfig(threshold=args.threshold, alpha=args.alpha),
                              max_remeasure=args.max_remeasure).run(shift.good, shift.bad)
            print(result.message)
            write_json(result, out / f"bisect-{shift.bad[:12]}-{shift.metric}-c{shift.concurrency}.json")
            culprit = result.first_bad.sha if result.first_bad else None
            record(args.db, **where, result=result)
            if result.profile_section:
                profiles.append(f"## {md_text(label)}\n\n{result.profile_section}")
        code = partial(md_code, in_table=True)  # commits and metric names come from the store: inert markdown
        lines.append(f"| {md_text(shift.metric)} | {shift.concurrency} | {code(shift.good[:12])} | "
                     f"{code(shift.bad[:12])} | {code(culprit) if culprit else 'not found'} |")
    (out / "culprits.md").write_text("# k2bench: culprits of tonight's shifts\n\n" + "\n".join(lines) + "\n"
                                     + "".join(f"\n{p}" for p in profiles))
    return 0


def _one_shift(bench, shift):
    """The bench of one shift: the shifted run's own workload, level and GPUs."""
    from dataclasses import replace

    from k2bench.errors import UserError
    from k2bench.workloads import loader

    run = shift.run
    try:
        workload = loader.resolve(run.get("workload"), run.get("isl"), run.get("osl"))
    except UserError:  # an ad-hoc workload: its lengths say it all
        workload = loader.resolve(None, run.get("isl"), run.get("osl"))
    profile_level = bench.cfg.profile_level
    if profile_level:  # the shift's own level is the one profiled, with the requests asked for
        from k2bench.harness.telemetry.profile import parse

        profile_level = f"{shift.concurrency}:{parse(profile_level).requests_for()}"
    return replace(bench, measured=[], cfg=replace(bench.cfg, levels=[shift.concurrency], workload=workload,
                                                   tp=run.get("tp") or 1, gpus=run.get("num_gpus"),
                                                   profile_level=profile_level))
