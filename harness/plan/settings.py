"""What a sweep is: each of its settings declared once, with its type, default, check, help, command-line
flag, suite-file key and environment variable.

`k2bench sweep`, `backfill`, `bisect` and `suite run` add their flags from `SETTINGS` (`add_flags`) and
build their `SweepConfig` through it (`SweepConfig.from_settings`); suite files are read through
`from_table`, so a key of a suite file and a flag of a command are the same setting, parsed and checked
by the same code. A new
setting is one `Setting(...)` below plus the code that uses its value (docs/development.md says how).

Cheap to import (argparse only); it never imports the sweep, which imports it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from k2bench.errors import UserError
from k2bench.harness.plan.settings_text import (
    Count,
    parse_concurrency,
    parse_count,
    parse_evals,
    parse_rates,
    parse_tags,
    parse_urls,
)
from k2bench.workloads.loader import DEFAULT as DEFAULT_WORKLOAD
from k2bench.workloads.loader import SHIPPED_TRACE as _SHIPPED_TRACE

Config = Any  # a SweepConfig: not imported, so that sweep.py may import this module
# the commands that take sweep settings as flags ("suite run" adds what a suite file leaves to the caller)
SWEEP, BACKFILL, BISECT, SUITE_RUN, CAPACITY = "sweep", "backfill", "bisect", "suite run", "capacity"
COMMANDS = (SWEEP, BACKFILL, BISECT, SUITE_RUN)
# `k2bench capacity` takes the sweep's settings except these: the search picks the levels (closed or rate),
# one trial each, and evaluations belong to a sweep
NOT_IN_CAPACITY = frozenset({"conc", "rate", "trials", "eval", "eval_data", "eval_limit"})
EVERYWHERE = frozenset({SWEEP, BACKFILL, BISECT})  # where a new setting goes unless it says otherwise
API_KEY_ENV = "K2BENCH_API_KEY"

GROUPS = {  # help group of each kind of setting, in --help order
    "server": "server (attach with --url, or launch with --engine)",
    "load": "load",
    "validity": "validity (an invalid level is kept, but left out of frontiers and the gate)",
    "slo": "service-level objective (attainment and goodput per level)",
    "accuracy": "accuracy (lm-evaluation-harness, after the levels, on the same server)",
    "recording": "recording",
    "telemetry": "telemetry (energy, cost, the server's own metrics)",
}


def at_least(low: float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"must be at least {low:g}"


def short(v: str) -> str | None:
    """Names are stored and capped there (record/bounds.py): refuse a longer one before a server starts."""
    from k2bench.harness.record.bounds import NAME_CAP

    return None if len(v) <= NAME_CAP else f"is {len(v)} characters; a stored name keeps at most {NAME_CAP}"


def positive(v: float) -> str | None:
    return None if v > 0 else "must be positive"


def _via(check: Callable[[Any], object]) -> Callable[[Any], str | None]:
    """A check owned by another module (it raises UserError): its message becomes the reason."""
    def run(v: Any) -> str | None:
        try:
            check(v)
        except UserError as exc:
            return str(exc)
        return None
    return run


def _failure_rate(v: float) -> None:
    from k2bench.harness.measure.validity import ValidityRules

    ValidityRules(max_failure_rate=v).validate()


def _count_check(minimum_n: int, what: str) -> Callable[[Count], str | None]:
    def check(c: Count) -> str | None:
        if c.n is not None and c.n < minimum_n:
            return f"must be at least {minimum_n}"
        if c.x is not None and (c.x <= 0 if minimum_n else c.x < 0):
            return f"as a multiple of the concurrency must be {what} (e.g. {'1x' if minimum_n else '0.5x'})"
        return None
    return check


def _slo(v: str) -> None:
    from k2bench.harness.measure.slo import parse_slo

    parse_slo(v)


def _client_procs(v: str) -> str | None:
    return None if v == "auto" or (v.isdigit() and int(v) >= 1) else "must be a whole number (1 or more) or 'auto'"


def _gpu_ids(v: str) -> None:
    from k2bench.harness.telemetry.gpu import parse_gpu_ids

    parse_gpu_ids(v)


def _price(v: float) -> None:
    from k2bench.harness.telemetry.cost import check_price

    check_price(v)


def _profile_level(v: str) -> None:
    from k2bench.harness.telemetry.profile import parse

    parse(v)


@dataclass(frozen=True)
class Setting:
    """One sweep setting. ``kind`` is its type: int, float, str, bool (a switch), "conc" (levels),
    "count" (N or Kx per level), "tags", "evals" or "urls" (repeatable flags: KEY=VALUE, TASK[@CONC], URL). ``attr`` is where the value lands in
    `SweepConfig` (dotted into ``rules.`` / ``telemetry.``); ``store`` replaces that when one value
    fills several fields. ``key`` is False for a setting a suite file may not carry."""

    name: str
    kind: Any
    group: str
    help: str
    default: Any = None
    check: Callable[[Any], str | None] | None = None
    commands: frozenset[str] = EVERYWHERE
    key: bool = True
    env: str | None = None
    metavar: str | None = None
    attr: str | None = None
    store: Callable[[Any], dict[str, Any]] | None = None
    read: Callable[[Config], Any] | None = None
    example: Any = None  # a valid value, for tests and docs
    cli: str | None = None  # the flag, when it is not --NAME with dashes

    @property
    def flag(self) -> str:
        return self.cli or "--" + self.name.replace("_", "-")

    def toml_types(self) -> tuple[type, ...]:
        return {int: (int,), float: (int, float), str: (str,), bool: (bool,), "conc": (str, int, list),
                "count": (str, int), "rates": (str, int, float, list), "tags": (list,), "evals": (list,),
                "urls": (list, str)}[self.kind]

    def parse(self, raw: Any, name: str) -> Any:
        """The value of raw text or a TOML value, as the config holds it; UserError if malformed."""
        if self.kind == "conc":
            return parse_concurrency(",".join(map(str, raw)) if isinstance(raw, list) else str(raw), name)
        if self.kind == "count":
            return parse_count(str(raw), name)
        if self.kind == "rates":
            return parse_rates(",".join(map(str, raw)) if isinstance(raw, list) else str(raw), name)
        if self.kind == "tags":
            return parse_tags(raw, name)
        if self.kind == "evals":
            return parse_evals(raw, name)
        if self.kind == "urls":
            return parse_urls(raw, name)
        if self.kind is float:
            return float(raw)
        return raw


def _store_count(prefix: str) -> Callable[[Count], dict[str, Any]]:
    return lambda c: {prefix: c.n, f"{prefix}_x": c.x}


def _read_count(prefix: str) -> Callable[[Config], Count]:
    return lambda cfg: Count(getattr(cfg, prefix), getattr(cfg, f"{prefix}_x"))


S = Setting
SWEEP_ONLY = frozenset({SWEEP})
SETTINGS: tuple[Setting, ...] = (
    S("url", str, "server", "attach to a running OpenAI-compatible server, e.g. http://host:8000",
      commands=SWEEP_ONLY, key=False),
    S("engine", str, "server", "launch a server through this recipe (bundled, atom, vllm, sglang, testserver; "
      "default bundled)", commands=SWEEP_ONLY, check=short, example="testserver"),
    S("server_cmd", str, "server", "launch this command line instead of a recipe (the custom recipe; backfill "
      "and bisect need it and run it in each commit's worktree): {port} (a free port k2bench picks; required), "
      "{host}, {model}, {tp} and {python} are filled in", metavar="CMD", example="python -m my_server --port {port}"),
    S("model", str, "server", "model path or id (default for bundled: the tiny model trained on tiny-arith, "
      "cached; for a backfill: the server's first model, recorded as 'default')", check=short,
      example="/models/k2"),
    S("tp", int, "server", "tensor parallel size", default=1, check=at_least(1), example=2),
    S("server_args", str, "server", "extra server arguments, one quoted string (write --server-args='--flag' "
      "for one flag)", example="--max-num-seqs 256"),
    S("api_key", str, "server", f"send 'Authorization: Bearer KEY' (default: env {API_KEY_ENV}, if set)",
      commands=SWEEP_ONLY, key=False, env=API_KEY_ENV),
    S("ready_timeout", float, "server", "seconds to wait for a launched server (default: the recipe's)",
      check=positive, metavar="S", attr="ready_timeout_s", example=600),
    S("workload", str, "load", f"workload name (8k1k, 1k1k, 1k8k, ...) or a .toml path (default: from "
      f"--isl/--osl, else {DEFAULT_WORKLOAD})", example="1k1k"),
    S("trace", str, "load", "replay a Mooncake-format trace (JSONL: timestamp ms, input_length, output_length, "
      "hash_ids): its requests at its send times, identical token blocks for equal hash ids; instead of "
      "--workload/--isl/--osl", metavar="FILE", example=str(_SHIPPED_TRACE)),
    S("trace_time_scale", float, "load", "multiply the trace's gaps between requests by this (0.5: twice as "
      "fast)", default=1.0, check=positive, metavar="X", example=0.5),
    S("isl", int, "load", "input tokens per request (overrides the workload)", check=at_least(1), example=64),
    S("osl", int, "load", "output tokens per request (overrides the workload)", check=at_least(1), example=8),
    S("conc", "conc", "load", "levels: 4..128 (powers of two, inclusive), 4,8,32, or 64 (with --rate and no "
      "--conc: none)", default="4..128", attr="levels", example="1..4"),
    S("rate", "rates", "load", "open-loop levels, requests/s each: 2,4,8 (inf: all at once). Alone it runs only "
      "these; with --conc as well, the closed levels run first, then the rate levels", attr="rates",
      metavar="R,R,...", example="2,4"),
    S("burstiness", float, "load", "rate levels: gamma shape of the gaps between sends (1 = Poisson, above 1 "
      "steadier, below 1 burstier)", default=1.0, check=lambda v: None if 0 < v < float("inf") else
      "must be a positive number", metavar="K", example=2),
    S("max_inflight", int, "load", "rate levels: at most N requests in flight; a request due while N are "
      "in flight waits in the client's queue (its wait is stored as queue time; default: no cap)",
      check=at_least(1), metavar="N", example=64),
    S("ramp_up", float, "load", "rate levels: the rate grows linearly from 0 over the first S seconds; "
      "requests sent then are warmup", default=0.0, check=lambda v: None if 0 <= v < float("inf") else
      "must be 0 or more seconds", metavar="S", attr="ramp_up_s", example=5),
    S("duration", float, "load", "rate levels: send for S seconds after warmup (--num-prompts N then caps "
      "the count)", check=positive, metavar="S", attr="duration_s", example=60),
    S("num_prompts", "count", "load", "measured requests per level: a count, or Kx for K x the level's "
      "concurrency (rate levels: K x the rate, K seconds' worth; default 10x)", check=_count_check(1, "positive"), metavar="N|Kx",
      store=_store_count("num_prompts"), read=_read_count("num_prompts"), example="2x"),
    S("warmup", "count", "load", "warmup requests per level: a count, or Kx (default 2x)",
      check=_count_check(0, "0 or more"), metavar="N|Kx", store=_store_count("warmup"),
      read=_read_count("warmup"), example=0),
    S("trials", int, "load", "repeat each level K times (stored as trial 0..K-1)", default=1, check=at_least(1),
      example=2),
    S("timeout", float, "load", "per-request timeout", default=1800.0, check=positive, metavar="S",
      attr="timeout_s", example=60),
    S("level_timeout", float, "load", "bound on a whole level, warmup included; a level that runs longer is "
      "stopped and stored invalid (default: none)", check=positive, metavar="S", attr="level_timeout_s",
      example=900),
    S("client_procs", str, "load", "client processes that share each level's requests, each with its own "
      "event loop and connections; 'auto' sizes each level from its expected token rate and the client's "
      "measured CPU per token, up to the cores", default="1", metavar="N|auto",
      check=_client_procs,
      example="2"),
    S("max_failure_rate", float, "validity", "fraction of a level's requests that may fail with the level "
      "still valid", default=0.0, check=_via(_failure_rate), metavar="R", attr="rules.max_failure_rate", example=0.01),
    S("max_client_cpu", float, "validity", "a level whose busiest client event loop used more than this "
      "fraction of a core is invalid: the client, not the server, set its pace", default=0.9,
      check=positive, metavar="F", attr="rules.max_client_cpu", example=0.8),
    S("max_loop_lag_ms", float, "validity", "a level whose client event loop ran callbacks later than this "
      "at p99 (ms) is invalid: its stamps are late by as much", default=50.0, check=positive, metavar="MS",
      attr="rules.max_loop_lag_ms", example=20),
    S("max_rate_error", float, "validity", "rate levels: the achieved rate may miss the rate the level's "
      "schedule asked for by this fraction with the level still valid", default=0.05,
      check=lambda v: None if 0 < v < 1 else "must be above 0 and below 1", metavar="R",
      attr="rules.max_rate_error", example=0.1),
    S("max_send_lag", float, "validity", "rate levels: p99 send lag (how late the client sent, less queue "
      "time) above this many ms makes the level invalid", default=50.0, check=positive, metavar="MS",
      attr="rules.max_send_lag_ms", example=100),
    S("allow_osl_mismatch", bool, "validity", "keep a level valid when outputs differ from the requested "
      "length (default: invalid)", default=False, attr="rules.allow_osl_mismatch", example=True),
    S("slo", str, "slo", "judge every level against this SLO: NAME=MS pairs, e.g. ttft_ms=2000,tpot_ms=50 "
      "(names: ttft_ms, tpot_ms, e2el_ms, itl_p99_ms); a request meets it when every bound holds; each level "
      "stores its attainment (with a 95%% interval) and goodput", check=_via(_slo), metavar="NAME=MS,...",
      commands=frozenset({*EVERYWHERE, SUITE_RUN}), example="ttft_ms=2000,tpot_ms=50"),
    S("eval", "evals", "accuracy", "evaluate TASK (k2bench eval --list) with CONC requests in flight (default: "
      "the highest level) and store it with the run (repeatable). The bundled engine on its default model "
      "evaluates tiny-arith unless told otherwise; 'none' evaluates nothing", commands=SWEEP_ONLY, key=False,
      metavar="TASK[@CONC]", attr="evals"),
    S("eval_data", str, "accuracy", "items of the evaluations (GSM8K-format JSONL)", commands=SWEEP_ONLY,
      key=False, metavar="PATH"),
    S("eval_limit", int, "accuracy", "only the first N items of each evaluation", check=at_least(1),
      commands=SWEEP_ONLY, key=False, metavar="N"),
    S("json_path", str, "recording", "also write the run as k2bench.run JSON", commands=SWEEP_ONLY, key=False,
      metavar="PATH", cli="--json"),
    S("commit", str, "recording", "commit measured (default: git HEAD, if in a git checkout)",
      commands=frozenset({SWEEP, SUITE_RUN}), key=False),
    S("branch", str, "recording", "branch measured (default: the current git branch; for a backfill: the "
      "repo's branch holding the commit)", commands=frozenset({*EVERYWHERE, SUITE_RUN}), key=False,
      check=short),
    S("tag", "tags", "recording", "free-form tag KEY=VALUE (repeatable)", commands=frozenset({*EVERYWHERE, SUITE_RUN}),
      key=False, metavar="KEY=VALUE", attr="tags"),
    S("gpus", int, "recording", "GPUs the server uses, for tok/s/GPU (default: --tp)", check=at_least(1), example=4),
    S("precision", str, "recording", "weight precision to record (default: from the model or recipe)",
      commands=SWEEP_ONLY, example="mxfp4"),
    S("hardware", str, "recording", "hardware name to record (default: detected)",
      commands=frozenset({*EVERYWHERE, SUITE_RUN}), example="MI355X"),
    S("notes", str, "recording", "free text stored with the run", commands=SWEEP_ONLY, key=False),
    S("log_dir", str, "recording", "where launched servers' logs go", default="results/logs",
      commands=frozenset({BACKFILL, BISECT, SUITE_RUN}), key=False),
    S("gpu_ids", str, "telemetry", "GPUs to read power from (default: the server's CUDA_VISIBLE_DEVICES / "
      "HIP_VISIBLE_DEVICES, else all; needs the gpu extra or amdsmi)", check=_via(_gpu_ids),
      commands=SWEEP_ONLY, metavar="0,1,...", attr="telemetry.gpu_ids", example="0,1"),
    S("gpu_hour_usd", float, "telemetry", "price of one GPU-hour for $ per million tokens (default: the "
      "shipped table's price for the recorded hardware, if it has one)", check=_via(_price),
      commands=SWEEP_ONLY, metavar="USD", attr="telemetry.gpu_hour_usd", example=2.5),
    S("metrics_url", "urls", "telemetry", "scrape this Prometheus /metrics endpoint instead of the server's own "
      "(repeatable: the prefill and decode workers of a disaggregated server; each sample is then labelled "
      "with its instance, host:port)", commands=SWEEP_ONLY, key=False, metavar="URL",
      attr="telemetry.metrics_urls", example="http://127.0.0.1:8100/metrics"),
    S("profile_level", str, "telemetry", "profile N requests at concurrency C in the server's profiler "
      "(/start_profile, /stop_profile), as an extra pass after that level's measured requests, so the level's "
      "figures stay unprofiled; the trace path and the kernel-time summary are kept with the run (default N: C)",
      check=_via(_profile_level), metavar="C[:N]", example="4:8"),
    S("no_telemetry", bool, "telemetry", "read neither GPU power nor the server's /metrics", default=False,
      commands=SWEEP_ONLY, key=False, store=lambda off: {"telemetry.gpu": not off, "telemetry.server_metrics": not off},
      read=lambda cfg: not (cfg.telemetry.gpu or cfg.telemetry.server_metrics)),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
RATE_ONLY = ("burstiness", "max_inflight", "ramp_up", "duration")  # settings that need --rate
FILE_KEYS: dict[str, Setting] = {s.name: s for s in SETTINGS if s.key}  # the job keys of suite files
WORKLOAD_KEYS = ("workload", "isl", "osl", "trace")  # together they give the config's one Workload


def takes(s: Setting, command: str) -> bool:
    """Does ``command`` take setting ``s`` as a flag?"""
    if command == CAPACITY:
        return SWEEP in s.commands and s.name not in NOT_IN_CAPACITY
    return command in s.commands


def default(name: str) -> Any:
    return BY_NAME[name].default


def _help(s: Setting) -> str:
    text = s.help
    if s.default is not None and s.default is not False and "default" not in text:
        text += f" (default {s.default:g})" if isinstance(s.default, float) else f" (default {s.default})"
    return text


def add_flags(parser: argparse.ArgumentParser, command: str,
              extra: Mapping[str, Callable[[argparse._ArgumentGroup], None]] | None = None) -> None:
    """The flags of every setting that ``command`` takes, in their help groups; ``extra[group]`` adds
    the command's own arguments to that group (e.g. --db under recording)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for s in SETTINGS:
        if not takes(s, command):
            continue
        if s.group not in groups:
            groups[s.group] = parser.add_argument_group(GROUPS[s.group])
            if extra and s.group in extra:
                extra[s.group](groups[s.group])
        kw: dict[str, Any] = {"dest": s.name, "default": None, "help": _help(s)}
        if s.kind is bool:
            kw["action"] = "store_true"
        elif s.kind in ("tags", "evals", "urls"):
            kw["action"] = "append"
        elif s.kind in (int, float):
            kw["type"] = s.kind
        if s.metavar and s.kind is not bool:
            kw["metavar"] = s.metavar
        groups[s.group].add_argument(s.flag, **kw)


def from_args(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The settings given on ``command``'s line, parsed and checked (absent ones are left out)."""
    given = {}
    for s in SETTINGS:
        raw = getattr(args, s.name, None) if takes(s, command) else None
        if raw is None or raw is False or raw == []:
            continue
        value = s.parse(raw, s.flag)
        _check(s, value, s.flag)
        given[s.name] = value
    return given


def check_value(key: str, raw: Any, where: str) -> Any:
    """One suite-file value (not a list to expand), parsed and checked: the error names the file, the
    key and the reason."""
    s = FILE_KEYS[key]
    try:
        value = s.parse(raw, key)
        reason = s.check(value) if s.check else None
    except UserError as exc:  # the parser's message names the key already
        raise UserError(f"{where}: {exc}") from None
    if reason:
        raise UserError(f"{where}: {key} = {raw!r} {reason}")
    return value


def from_table(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A suite job's fields as settings (each checked; unknown keys refused)."""
    unknown = sorted(set(table) - set(FILE_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join(sorted(FILE_KEYS))}")
    return {key: check_value(key, raw, where) for key, raw in table.items()}


def _check(s: Setting, value: Any, name: str) -> None:
    reason = s.check(value) if s.check and value is not None else None
    if reason:
        raise UserError(reason if reason.startswith(name) else f"{name} {reason}")


def _targets(s: Setting, value: Any) -> dict[str, Any]:
    if s.store:
        return s.store(value)
    return {s.attr or s.name: value}


def _read(cfg: Any, s: Setting) -> Any:
    if s.read:
        return s.read(cfg)
    obj: Any = cfg
    for part in (s.attr or s.name).split("."):
        obj = getattr(obj, part)
    return obj


def defaults() -> dict[str, Any]:
    """Every declared default, and the values the environment gives (e.g. K2BENCH_API_KEY)."""
    start = {s.name: s.default for s in SETTINGS if s.default is not None}
    start.update({s.name: os.environ[s.env] for s in SETTINGS if s.env and os.environ.get(s.env)})
    start["conc"] = parse_concurrency(start["conc"], "conc")
    return start


def apply(base: Config, given: Mapping[str, Any], **context: Any) -> Config:
    """``base`` (a SweepConfig) with the ``given`` settings in their fields, checked; ``context`` sets
    fields that are no setting (db, command_line, ...). `SweepConfig.from_settings` starts it from
    `defaults()`."""
    from dataclasses import replace

    from k2bench.workloads import loader

    top: dict[str, Any] = dict(context)
    nested: dict[str, dict[str, Any]] = {}
    for name, value in given.items():
        if name in WORKLOAD_KEYS:
            continue
        for target, v in _targets(BY_NAME[name], value).items():
            outer, _, inner = target.partition(".")
            if inner:
                nested.setdefault(outer, {})[inner] = v
            else:
                top[outer] = v
    if "trace" in given and ("conc" in given or "rate" in given):
        raise UserError("--trace sends the trace's requests at its own times: leave out --conc and --rate")
    if "rate" in given and "conc" not in given:
        top["levels"] = []  # --rate alone runs only rate levels (with --conc too, both kinds)
    if any(k in given for k in WORKLOAD_KEYS):
        top["workload"] = loader.resolve(*(given.get(k) for k in WORKLOAD_KEYS))
    for outer, fields in nested.items():
        top[outer] = replace(getattr(base, outer), **fields)
    cfg = replace(base, **top)
    validate(cfg)
    return cfg


def validate(cfg: Any) -> None:
    """Every check of a config, whoever built it: each setting's own check on the value the config
    holds, then the checks between settings."""
    given = [s.flag for s in (BY_NAME["url"], BY_NAME["engine"], BY_NAME["server_cmd"]) if _read(cfg, s)]
    if len(given) > 1:
        raise UserError(f"give either --url (attach to a running server) or --engine / --server-cmd (launch "
                        f"one), not both ({' and '.join(given)})")
    if cfg.telemetry.metrics_urls and not cfg.telemetry.server_metrics:
        raise UserError("--metrics-url names servers to scrape, --no-telemetry scrapes none: give one of them")
    for s in SETTINGS:
        if s.name not in WORKLOAD_KEYS:  # the Workload checks its own lengths when it is made
            _check(s, _read(cfg, s), s.flag)
    rates = getattr(cfg, "rates", None) or []
    if not cfg.levels and not rates:
        raise UserError("--conc gave no levels and --rate none either: give levels of one kind or both")
    if not rates:
        given = [s.flag for s in SETTINGS if s.name in RATE_ONLY and _read(cfg, s) not in (None, s.default)]
        if given:
            raise UserError(f"{' and '.join(given)} shape rate levels only: add --rate")
    elif any(r == float("inf") for r in rates) and cfg.num_prompts is None and cfg.max_inflight is None:
        raise UserError("--rate inf sends a level's requests all at once, so its count cannot be K seconds' "
                        "worth: give --num-prompts N (or --max-inflight N, for Kx of the cap)")
    if cfg.profile_level:
        from k2bench.harness.telemetry.profile import parse

        conc = parse(cfg.profile_level).concurrency
        if conc not in cfg.levels:
            raise UserError(f"--profile-level {cfg.profile_level}: concurrency {conc} is not among the levels "
                            f"({','.join(map(str, cfg.levels))})")


def check_job(fields: Mapping[str, Any], where: str) -> None:
    """What a suite job may not combine."""
    if fields.get("engine") and fields.get("server_cmd"):
        raise UserError(f"{where}: a job gives both engine and server_cmd: {dict(fields)}")


def flags_of(command: str) -> Iterable[str]:
    return (s.flag for s in SETTINGS if takes(s, command))
