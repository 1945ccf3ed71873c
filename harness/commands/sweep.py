"""`k2bench sweep`: measure a server at each concurrency level and store the run.

Heavy imports (aiohttp, numpy, sqlalchemy, rich) happen inside the handler.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import sys
import textwrap

from k2bench.errors import UserError
from k2bench.harness.commands.common import add_db_arg

MAX_CONCURRENCY = 1 << 16
DEFAULT_CONC = "4..128"

DEFAULT_MODEL_EVAL = "tiny-arith"  # the task the bundled engine's default model is trained on
DEFAULTS_NOTE = ("With no --url and no --engine, the bundled engine serves a tiny MXFP4 model on this machine "
                 f"(TP 1), trained once on {DEFAULT_MODEL_EVAL} and cached, and the run carries its accuracy on "
                 f"{DEFAULT_MODEL_EVAL}'s held-out items.")


def exit_code_table() -> str:
    from k2bench.harness.sweep import EXIT_CODES

    return "exit codes:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="benchmark a server over concurrency levels and store the run",
        description=textwrap.fill("Closed-loop sweep over concurrency levels; each finished level is stored at "
                                  "once. " + DEFAULTS_NOTE, width=100),  # the raw formatter keeps the epilog's table
        epilog=exit_code_table(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = p.add_argument_group("server (attach with --url, or launch with --engine)")
    target.add_argument("--url", help="attach to a running OpenAI-compatible server, e.g. http://host:8000")
    target.add_argument("--engine", help="launch a server through this recipe (bundled, atom, vllm, sglang, "
                                         "testserver; default bundled)")
    target.add_argument("--server-cmd", metavar="CMD",
                        help="launch this command line instead of a recipe (the custom recipe): {port} (a free "
                             "port k2bench picks; required), {host}, {model}, {tp} and {python} are filled in")
    target.add_argument("--model", help="model path or id (default for bundled: the tiny model trained on tiny-arith, cached)")
    target.add_argument("--tp", type=int, default=1, help="tensor parallel size (default 1)")
    target.add_argument("--server-args", default=None,
                        help="extra server arguments, one quoted string (write --server-args='--flag' for one flag)")
    target.add_argument("--api-key", default=None,
                        help="send 'Authorization: Bearer KEY' (default: env K2BENCH_API_KEY, if set)")
    target.add_argument("--ready-timeout", type=float, default=None, metavar="S",
                        help="seconds to wait for a launched server (default: the recipe's)")
    load = p.add_argument_group("load")
    load.add_argument("--workload", help="workload name (8k1k, 1k1k, 1k8k, ...) or a .toml path "
                                         "(default: from --isl/--osl, else 8k1k)")
    load.add_argument("--isl", type=int, help="input tokens per request (overrides the workload)")
    load.add_argument("--osl", type=int, help="output tokens per request (overrides the workload)")
    load.add_argument("--conc", default=None,
                      help=f"levels: 4..128 (powers of two, inclusive), 4,8,32, or 64 (default {DEFAULT_CONC})")
    load.add_argument("--num-prompts", default=None, metavar="N|Kx",
                      help="measured requests per level: a count, or Kx for K x the level's concurrency (default 10x)")
    load.add_argument("--warmup", default=None, metavar="N|Kx",
                      help="warmup requests per level: a count, or Kx (default 2x)")
    load.add_argument("--trials", type=int, default=1, help="repeat each level K times (stored as trial 0..K-1)")
    load.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="per-request timeout (default 1800)")
    load.add_argument("--level-timeout", type=float, default=None, metavar="S",
                      help="bound on a whole level, warmup included; a level that runs longer is stopped and "
                           "stored invalid (default: none)")
    valid = p.add_argument_group("validity (an invalid level is kept, but left out of frontiers and the gate)")
    valid.add_argument("--max-failure-rate", type=float, default=0.0, metavar="R",
                       help="fraction of a level's requests that may fail with the level still valid (default 0)")
    valid.add_argument("--allow-osl-mismatch", action="store_true",
                       help="keep a level valid when outputs differ from the requested length (default: invalid)")
    acc = p.add_argument_group("accuracy (lm-evaluation-harness, after the levels, on the same server)")
    acc.add_argument("--eval", action="append", default=[], metavar="TASK[@CONC]",
                     help="evaluate TASK (k2bench eval --list) with CONC requests in flight (default: the "
                          "highest level) and store it with the run (repeatable). The bundled engine on its "
                          f"default model evaluates {DEFAULT_MODEL_EVAL} unless told otherwise; 'none' evaluates "
                          "nothing")
    acc.add_argument("--eval-data", metavar="PATH", help="items of the evaluations (GSM8K-format JSONL)")
    acc.add_argument("--eval-limit", type=int, metavar="N", help="only the first N items of each evaluation")
    rec = p.add_argument_group("recording")
    add_db_arg(rec)
    rec.add_argument("--json", dest="json_path", metavar="PATH", help="also write the run as k2bench.run JSON")
    rec.add_argument("--commit", help="commit measured (default: git HEAD, if in a git checkout)")
    rec.add_argument("--branch", help="branch measured (default: the current git branch)")
    rec.add_argument("--tag", action="append", metavar="KEY=VALUE", help="free-form tag (repeatable)")
    rec.add_argument("--gpus", type=int, default=None, help="GPUs the server uses, for tok/s/GPU (default: --tp)")
    rec.add_argument("--precision", help="weight precision to record (default: from the model or recipe)")
    rec.add_argument("--hardware", help="hardware name to record (default: detected)")
    rec.add_argument("--notes", help="free text stored with the run")
    tel = p.add_argument_group("telemetry (energy, cost, the server's own metrics)")
    tel.add_argument("--gpu-ids", default=None, metavar="0,1,...",
                     help="GPUs to read power from (default: the server's CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES, "
                          "else all; needs the gpu extra or amdsmi)")
    tel.add_argument("--gpu-hour-usd", type=float, default=None, metavar="USD",
                     help="price of one GPU-hour for $ per million tokens (default: the shipped table's price "
                          "for the recorded hardware, if it has one)")
    tel.add_argument("--no-telemetry", action="store_true",
                     help="read neither GPU power nor the server's /metrics")
    p.set_defaults(handler=_sweep)


def parse_concurrency(text: str) -> list[int]:
    """``4..128`` (powers of two from 4 to 128 inclusive), ``4,8,32`` or ``64``; else UserError."""
    spec = text.strip()
    m = re.fullmatch(r"(\d+)\s*\.\.\s*(\d+)", spec)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo < 1 or hi < 1:
            raise UserError(f"--conc {spec!r}: bounds must be at least 1")
        if lo > hi:
            raise UserError(f"--conc {spec!r}: the lower bound is above the upper bound")
        if lo & (lo - 1) or hi & (hi - 1):
            raise UserError(f"--conc {spec!r}: a range runs over powers of two, so both bounds must be powers "
                            f"of two (e.g. 4..128); list other levels explicitly, e.g. 4,12,48")
        levels = []
        c = lo
        while c <= hi:
            levels.append(c)
            c *= 2
        return _check_levels(levels, spec)
    if re.fullmatch(r"\d+(\s*,\s*\d+)*", spec):
        return _check_levels([int(x) for x in spec.split(",")], spec)
    raise UserError(f"--conc {spec!r}: expected a range of powers of two like 4..128, a list like 4,8,32, "
                    f"or one number like 64")


def _check_levels(levels: list[int], spec: str) -> list[int]:
    for c in levels:
        if c < 1:
            raise UserError(f"--conc {spec!r}: concurrency must be at least 1")
        if c > MAX_CONCURRENCY:
            raise UserError(f"--conc {spec!r}: concurrency {c} is above the limit {MAX_CONCURRENCY}")
    if len(set(levels)) != len(levels):
        raise UserError(f"--conc {spec!r}: a level is listed twice")
    return levels


def parse_count(text: str | None, flag: str) -> tuple[int | None, float | None]:
    """'40' -> (40, None): that many per level; '2x' -> (None, 2.0): twice each level's concurrency."""
    if text is None:
        return None, None
    t = text.strip().lower()
    try:
        if t.endswith("x"):
            multiple = float(t[:-1])
            if math.isfinite(multiple):  # "nanx" / "infx" would only fail later, as a traceback
                return None, multiple
        else:
            return int(t), None
    except ValueError:
        pass
    raise UserError(f"{flag} takes a count (40) or a multiple of the concurrency (2x), not {text!r}")


def default_evals(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    """--eval as given; without it, the bundled engine's default model is evaluated on the task it was
    trained on, so every default sweep carries an accuracy figure (skipped, with a note, without lm-eval)."""
    given = [e.strip() for e in args.eval]
    if "none" in given:
        if given != ["none"]:
            raise UserError("--eval none evaluates nothing; it cannot be combined with tasks")
        return []
    if given:
        return parse_evals(given)
    if args.url or args.server_cmd or args.model or args.engine not in (None, "bundled"):
        return []
    if importlib.util.find_spec("lm_eval") is None:
        print(f"k2bench: note: no accuracy for this run: evaluating {DEFAULT_MODEL_EVAL} needs "
              "lm-evaluation-harness (pip install 'k2bench[eval]')", file=sys.stderr)
        return []
    return [(DEFAULT_MODEL_EVAL, None)]


def parse_evals(items: list[str]) -> list[tuple[str, int | None]]:
    """'tiny-arith' -> ('tiny-arith', None); 'gsm8k@64' -> ('gsm8k', 64); the task names are checked here."""
    from k2bench.harness.eval.tasks import get_task

    out = []
    for item in items:
        task, sep, conc = item.partition("@")
        get_task(task.strip())
        if sep and not (conc.strip().isdigit() and int(conc) >= 1):
            raise UserError(f"--eval {item!r}: expected TASK or TASK@CONC with CONC a positive integer")
        out.append((task.strip(), int(conc) if sep else None))
    return out


def parse_tags(items: list[str] | None) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--tag {item!r}: expected key=value")
        tags[key.strip()] = value.strip()
    return tags


def _config(args: argparse.Namespace):
    from k2bench.harness.sweep import SweepConfig
    from k2bench.harness.telemetry.level import TelemetryConfig
    from k2bench.harness.validity import ValidityRules
    from k2bench.workloads import loader

    for name in ("isl", "osl"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise UserError(f"--{name} must be at least 1")
    num_prompts, num_prompts_x = parse_count(args.num_prompts, "--num-prompts")
    warmup, warmup_x = parse_count(args.warmup, "--warmup")
    return SweepConfig(
        levels=parse_concurrency(args.conc or DEFAULT_CONC),
        workload=loader.resolve(args.workload, args.isl, args.osl),
        url=args.url, engine=args.engine, server_cmd=args.server_cmd, model=args.model, tp=args.tp,
        num_prompts=num_prompts,
        num_prompts_x=num_prompts_x, warmup=warmup, warmup_x=warmup_x, trials=args.trials, db=args.db,
        json_path=args.json_path, commit=args.commit,
        branch=args.branch, tags=parse_tags(args.tag), gpus=args.gpus, timeout_s=args.timeout,
        server_args=args.server_args, precision=args.precision, hardware=args.hardware,
        ready_timeout_s=args.ready_timeout, notes=args.notes,
        api_key=args.api_key or os.environ.get("K2BENCH_API_KEY") or None,
        rules=ValidityRules(max_failure_rate=args.max_failure_rate, allow_osl_mismatch=args.allow_osl_mismatch),
        level_timeout_s=args.level_timeout, command_line=getattr(args, "argv", None),
        evals=default_evals(args), eval_data=args.eval_data, eval_limit=args.eval_limit,
        telemetry=TelemetryConfig(gpu=not args.no_telemetry, server_metrics=not args.no_telemetry,
                                  gpu_ids=args.gpu_ids, gpu_hour_usd=args.gpu_hour_usd),
    )


def _is_bare(args: argparse.Namespace) -> bool:
    """No server, workload, lengths or levels given: the design card's full sweep on this machine."""
    return not any((args.url, args.engine, args.model, args.workload, args.isl, args.osl, args.conc))


def _sweep(args: argparse.Namespace) -> int:
    from k2bench.harness import estimate
    from k2bench.harness.commands.sweep_output import SweepDisplay, report
    from k2bench.harness.sweep import LevelEvents, run_sweep

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
