"""`k2bench sweep`: measure a server at each concurrency level and store the run.

Heavy imports (aiohttp, numpy, sqlalchemy, rich) happen inside the handler.
"""

from __future__ import annotations

import argparse
import math
import os
import re

from k2bench.errors import UserError
from k2bench.harness.commands.common import add_db_arg, table_console

MAX_CONCURRENCY = 1 << 16

DEFAULTS_NOTE = ("With no --url and no --engine, the bundled engine serves a tiny generated MXFP4 model "
                 "on this machine (TP 1).")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="benchmark a server over concurrency levels and store the run",
        description="Closed-loop sweep over concurrency levels; each finished level is stored at once. "
                    + DEFAULTS_NOTE,
    )
    target = p.add_argument_group("server (attach with --url, or launch with --engine)")
    target.add_argument("--url", help="attach to a running OpenAI-compatible server, e.g. http://host:8000")
    target.add_argument("--engine", help="launch a server through this recipe (bundled, atom, vllm, sglang, "
                                         "testserver; default bundled)")
    target.add_argument("--server-cmd", metavar="CMD",
                        help="launch this command line instead of a recipe (the custom recipe): {port} (a free "
                             "port k2bench picks; required), {host}, {model}, {tp} and {python} are filled in")
    target.add_argument("--model", help="model path or id (default for bundled: the tiny generated model)")
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
    load.add_argument("--conc", default="4..128",
                      help="levels: 4..128 (powers of two, inclusive), 4,8,32, or 64 (default 4..128)")
    load.add_argument("--num-prompts", default=None, metavar="N|Kx",
                      help="measured requests per level: a count, or Kx for K x the level's concurrency (default 10x)")
    load.add_argument("--warmup", default=None, metavar="N|Kx",
                      help="warmup requests per level: a count, or Kx (default 2x)")
    load.add_argument("--trials", type=int, default=1, help="repeat each level K times (stored as trial 0..K-1)")
    load.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="per-request timeout (default 1800)")
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
    from k2bench.workloads import loader

    for name in ("isl", "osl"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise UserError(f"--{name} must be at least 1")
    num_prompts, num_prompts_x = parse_count(args.num_prompts, "--num-prompts")
    warmup, warmup_x = parse_count(args.warmup, "--warmup")
    return SweepConfig(
        levels=parse_concurrency(args.conc), workload=loader.resolve(args.workload, args.isl, args.osl),
        url=args.url, engine=args.engine, server_cmd=args.server_cmd, model=args.model, tp=args.tp,
        num_prompts=num_prompts,
        num_prompts_x=num_prompts_x, warmup=warmup, warmup_x=warmup_x, trials=args.trials, db=args.db,
        json_path=args.json_path, commit=args.commit,
        branch=args.branch, tags=parse_tags(args.tag), gpus=args.gpus, timeout_s=args.timeout,
        server_args=args.server_args, precision=args.precision, hardware=args.hardware,
        ready_timeout_s=args.ready_timeout, notes=args.notes,
        api_key=args.api_key or os.environ.get("K2BENCH_API_KEY") or None,
        telemetry=TelemetryConfig(gpu=not args.no_telemetry, server_metrics=not args.no_telemetry,
                                  gpu_ids=args.gpu_ids, gpu_hour_usd=args.gpu_hour_usd),
    )


def _sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from k2bench.harness.commands.runs import points_table
    from k2bench.harness.sweep import LevelEvents, run_sweep

    cfg = _config(args)
    console = Console(stderr=True)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, refresh_per_second=4)

    def level_start(conc: int, trial: int, total: int):
        label = f"conc {conc}" + (f" trial {trial}" if cfg.trials > 1 else "")
        task = progress.add_task(label, total=total)
        failures = [0]

        def done(rec) -> None:
            if not rec.success:
                failures[0] += 1
                progress.update(task, description=f"{label} [red]{failures[0]} failed[/red]")
            progress.advance(task)

        return done

    events = LevelEvents(level_start=level_start, message=lambda text: console.print(f"[dim]{text}[/dim]"))
    with progress:
        result = run_sweep(cfg, events)
    title = (f"run {result.run_id} ({result.status}): {result.meta.get('engine')} {result.meta.get('model')}, "
             f"{result.meta.get('workload')}, {result.meta.get('num_gpus')} GPU(s)")
    table_console().print(points_table(result.points, title))
    if cfg.json_path:
        console.print(f"wrote {cfg.json_path}")
    bad = sum(p["failed"] for p in result.points)
    if bad:
        first = next((e for p in result.points for e in p.get("errors") or []), "")
        console.print(f"[yellow]{bad} request(s) failed; first error: {first}[/yellow]")
    return 0
