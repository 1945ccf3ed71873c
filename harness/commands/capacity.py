"""`k2bench capacity`: the highest load whose SLO attainment meets a target (k2bench.harness.run.capacity).

It launches or attaches exactly as `sweep` does, with the sweep's flags (harness/plan/settings.py) less
the ones the search decides (levels, trials); its own flags say what to search for.
"""

from __future__ import annotations

import argparse
import textwrap

from k2bench.harness.commands.common import add_db_arg
from k2bench.harness.plan import settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity", help="find the highest load that meets an SLO (bracket, then bisect; one stored run)",
        description=textwrap.fill(
            "Probe a server at growing load until a probe's attainment of --slo (required) misses the target, then bisect "
            "between the last probe that met it and the first that missed, until the two are within "
            "--tolerance or --max-probes are spent. Each probe is a stored level of one run; the result "
            "is stored in the run's extra.capacity, where regress and the dashboard read it.", width=100),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("search")
    g.add_argument("--by", default="concurrency", choices=["concurrency", "rate"],
                   help="the load axis searched: concurrency (requests in flight, closed loop; the default) or "
                        "rate (requests/s, open loop: --burstiness, --max-inflight, --ramp-up, --duration apply)")
    g.add_argument("--target", type=float, default=0.99,
                   help="attainment a probe must reach: the share of its requests that meet the SLO (default 0.99)")
    g.add_argument("--max-probes", type=int, default=8, metavar="N", help="probes at most (default 8)")
    g.add_argument("--start", type=float, default=None, metavar="LOAD",
                   help="the first probe's load (default 4 requests in flight, or 1 request/s); the search "
                        "doubles it until a probe misses")
    g.add_argument("--tolerance", type=float, default=0.1, metavar="F",
                   help="stop when the lowest missing load is within this fraction above the highest "
                        "meeting one (default 0.1)")
    settings.add_flags(p, settings.CAPACITY, extra={"recording": add_db_arg})
    p.set_defaults(handler=_capacity)


def _search_settings(args: argparse.Namespace):
    from k2bench.errors import UserError
    from k2bench.harness.measure.slo import parse_slo
    from k2bench.harness.run.capacity import SearchSettings

    if not args.slo:
        raise UserError("capacity needs --slo: the bounds a request must meet, e.g. --slo ttft_ms=2000,tpot_ms=50")
    found = SearchSettings(slo=parse_slo(args.slo), by=args.by, target=args.target, max_probes=args.max_probes,
                           start=args.start, tolerance=args.tolerance)
    found.validate()
    return found


def _capacity(args: argparse.Namespace) -> int:
    import sys

    from k2bench.errors import UserError
    from k2bench.harness.commands.sweep_output import SweepDisplay, report
    from k2bench.harness.run.capacity import prepare, run_capacity
    from k2bench.harness.run.config import SweepConfig
    from k2bench.harness.run.sweep import EXIT_INVALID, EXIT_OK, LevelEvents

    search = _search_settings(args)  # bad input is refused before a server starts
    given = settings.from_args(args, settings.CAPACITY)
    if search.by == "rate":
        given["rate"] = [search.first_load()]  # the search replaces it; rate-level flags are checked with it
    else:
        rate_flags = [settings.BY_NAME[name].flag for name in settings.RATE_ONLY if name in given]
        if rate_flags:
            raise UserError(f"{' and '.join(rate_flags)} shape rate levels only: search with --by rate")
    cfg = SweepConfig.from_settings(given, db=args.db, command_line=getattr(args, "argv", None))
    prepare(cfg, search)
    with SweepDisplay(cfg) as display:
        events = LevelEvents(level_start=display.level_start, level_done=display.level_done, message=display.say)
        result, found = run_capacity(cfg, search, events)
    report(result, cfg, args.db)
    if result.run_id is None:
        return result.exit_code
    print(found.summary())
    for side, probe in (("met", found.below), ("missed", found.above)):
        if probe:
            print(f"  {side:<6} at {probe['load']:g}: attainment {100 * probe['attainment']:.1f}% "
                  f"({probe['met']}/{probe['n']}; 95% CI {100 * probe['low']:.1f}-{100 * probe['high']:.1f}%)")
    print(f"  {len(found.probes)} probe(s), stored with run {result.run_id} (extra.capacity)")
    sys.stdout.flush()
    if result.exit_code not in (EXIT_OK, EXIT_INVALID):  # server problem, interruption: the sweep's code
        return result.exit_code
    return EXIT_OK if found.capacity is not None else EXIT_INVALID
