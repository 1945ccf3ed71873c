"""`k2bench sweep`: measure a server at each concurrency level and store the run.

Heavy imports (aiohttp, numpy, sqlalchemy, rich) happen inside the handler.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import textwrap

from k2bench.harness.commands.common import add_db_arg
from k2bench.harness.plan import settings
from k2bench.harness.plan.settings_text import parse_evals

DEFAULT_MODEL_EVAL = "tiny-arith"  # the task the bundled engine's default model is trained on
DEFAULTS_NOTE = ("With no --url and no --engine, the bundled engine serves a tiny MXFP4 model on this machine "
                 f"(TP 1), trained once on {DEFAULT_MODEL_EVAL} and cached, and the run carries its accuracy on "
                 f"{DEFAULT_MODEL_EVAL}'s held-out items.")


def exit_code_table() -> str:
    from k2bench.harness.run.sweep import EXIT_CODES

    return "exit codes:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="benchmark a server over concurrency levels and store the run",
        description=textwrap.fill("Closed-loop sweep over concurrency levels; each finished level is stored at "
                                  "once. " + DEFAULTS_NOTE, width=100),  # the raw formatter keeps the epilog's table
        epilog=exit_code_table(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    settings.add_flags(p, settings.SWEEP, extra={"recording": add_db_arg})
    p.set_defaults(handler=_sweep)


def default_evals(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    """--eval as given; without it, the bundled engine's default model is evaluated on the task it was
    trained on, so every default sweep carries an accuracy figure (skipped, with a note, without lm-eval)."""
    if args.eval:
        return parse_evals(args.eval)
    if args.url or args.server_cmd or args.model or args.engine not in (None, "bundled"):
        return []
    if importlib.util.find_spec("lm_eval") is None:
        print(f"k2bench: note: no accuracy for this run: evaluating {DEFAULT_MODEL_EVAL} needs "
              "lm-evaluation-harness (pip install 'k2bench[eval]')", file=sys.stderr)
        return []
    return [(DEFAULT_MODEL_EVAL, None)]


def _config(args: argparse.Namespace):
    from k2bench.harness.run.config import SweepConfig

    given = settings.from_args(args, settings.SWEEP)
    cfg = SweepConfig.from_settings(given, db=args.db, command_line=getattr(args, "argv", None))
    if "eval" not in given:
        cfg.evals = default_evals(args)
    return cfg


def _is_bare(args: argparse.Namespace) -> bool:
    """No server, workload, lengths or levels given: the design card's full sweep on this machine."""
    return not any((args.url, args.engine, args.model, args.workload, args.isl, args.osl, args.conc))


def _sweep(args: argparse.Namespace) -> int:
    from k2bench.harness.commands.sweep_output import SweepDisplay, report
    from k2bench.harness.plan import estimate
    from k2bench.harness.run.sweep import LevelEvents, run_sweep

    cfg = _config(args)
    with SweepDisplay(cfg) as display:
        if _is_bare(args):
            display.say(f"no --conc, --isl/--osl or server given: this is the design card's full sweep "
                        f"({cfg.workload.name}, concurrency {','.join(map(str, cfg.levels))}) on the bundled engine "
                        f"here, which takes hours on a CPU.\n  a sweep that finishes in minutes: "
                        f"{estimate.QUICK_SWEEP}\n  the full sweep on a GPU: {estimate.FULL_ON_GPU}")
        events = LevelEvents(level_start=display.level_start, level_done=display.level_done, message=display.say)
        result = run_sweep(cfg, events)
    report(result, cfg, args.db)
    if cfg.evals and result.run_id is not None:
        from k2bench.harness.commands.runs import eval_line
        from k2bench.harness.store import Store

        with Store.open(cfg.db, readonly=True) as store:
            for ev in store.get_evals(result.run_id):
                print(eval_line(ev))
    return result.exit_code
