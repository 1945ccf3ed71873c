"""A sweep: one server (attached or launched), one workload, a level per concurrency (x trials).

cli -> sweep -> (launch, workload, loadgen) -> metrics -> store. This module holds the level loop;
the server comes from `launch.open_server`, what the run records about its origin from
`provenance`, the prompts from `k2bench.workloads.prompts`. Each level is summarised and
committed to the store as soon as it finishes, so Ctrl-C or a crash keeps every finished level
and the run is marked partial; a run with no finished level is marked failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from k2bench.errors import ServerError, UserError
from k2bench.harness import crash, redact
from k2bench.harness.load import openloop, procs, procs_rate, schedule, selfmeasure
from k2bench.harness.load.client_size import ClientSizer
from k2bench.harness.load.level_watch import LevelWatch
from k2bench.harness.load.loadgen import LevelSpec, level_failure, run_level
from k2bench.harness.load.loadgen import run as run_async
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure import workload_metrics
from k2bench.harness.measure.slo import attainment, parse_slo
from k2bench.harness.measure.validity import ValidityRules, judge_level
from k2bench.harness.plan import estimate, settings
from k2bench.harness.record import provenance, repro
from k2bench.harness.run import level_work
from k2bench.harness.run.profiled import profiled_pass
from k2bench.harness.servers import launch
from k2bench.harness.telemetry import profile
from k2bench.harness.telemetry.level import LevelTelemetry, TelemetryConfig
from k2bench.workloads import prompts as prompt_gen
from k2bench.workloads.build import level_prompts
from k2bench.workloads.loader import Workload


@dataclass
class SweepConfig:
    """Everything a sweep needs; `settings.build` fills it from flags and suite files, tests build it
    directly. The defaults and checks of its fields are declared in `settings`."""

    levels: list[int]
    workload: Workload
    url: str | None = None
    engine: str | None = None
    server_cmd: str | None = None  # launch this command line instead of a recipe (the custom recipe)
    server_cwd: str | None = None  # where the launched server runs (a backfilled commit's worktree)
    model: str | None = None
    tp: int = settings.default("tp")
    num_prompts: int | None = None  # per level; default 10 x concurrency
    warmup: int | None = None  # per level; default 2 x concurrency
    num_prompts_x: float | None = None  # per level as a multiple of the concurrency ("--num-prompts 1x")
    warmup_x: float | None = None  # likewise for --warmup
    trials: int = settings.default("trials")
    db: str | None = None
    json_path: str | None = None
    commit: str | None = None
    branch: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    timeout_s: float = settings.default("timeout")
    server_args: str | None = None
    precision: str | None = None
    hardware: str | None = None
    ready_timeout_s: float | None = None
    log_dir: str = settings.default("log_dir")
    api_key: str | None = None
    notes: str | None = None
    rules: ValidityRules = field(default_factory=ValidityRules)
    level_timeout_s: float | None = None  # bounds a whole level, warmup included
    command_line: list[str] | None = None  # the k2bench arguments, for the reproducible record
    evals: list[tuple[str, int | None]] = field(default_factory=list)  # (task, concurrency or None: highest level)
    eval_data: str | None = None  # --data of the evaluations (GSM8K-format JSONL)
    eval_limit: int | None = None  # only the first N items of each evaluation
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)  # GPU power, server metrics, price
    slo: str | None = None  # SLO text (k2bench.harness.measure.slo): each level's attainment and goodput
    client_procs: str = settings.default("client_procs")  # worker processes per level: "N" or "auto"
    trace_time_scale: float = settings.default("trace_time_scale")  # --trace only: scales the trace's gaps
    rates: list[float] = field(default_factory=list)  # open-loop levels, requests/s (inf: all at once)
    burstiness: float = settings.default("burstiness")  # gamma shape of the gaps (1 = Poisson)
    max_inflight: int | None = None  # rate levels: cap on requests in flight
    ramp_up_s: float = settings.default("ramp_up")  # rate levels: the rate grows linearly over the first S seconds (warmup)
    duration_s: float | None = None  # rate levels: measured sending time; num_prompts (if given) caps it
    profile_level: str | None = None  # C[:N]: profile N requests at concurrency C (an extra pass)

    @classmethod
    def from_settings(cls, given: Mapping[str, object], base: SweepConfig | None = None,
                      **context: object) -> SweepConfig:
        """The config of ``given`` settings (`settings.from_args` / `from_table`) over ``base``, which
        defaults to the declared defaults; checked."""
        if base is None:
            from k2bench.workloads.loader import resolve

            base = settings.apply(cls(levels=[1], workload=resolve(None, None, None)), settings.defaults())
        return settings.apply(base, given, **context)

    def prompts_for(self, conc: int) -> int:
        if self.num_prompts is not None:
            return self.num_prompts
        return max(1, round((10 if self.num_prompts_x is None else self.num_prompts_x) * conc))

    def warmup_for(self, conc: int) -> int:
        if self.warmup is not None:
            return self.warmup
        return round((2 if self.warmup_x is None else self.warmup_x) * conc)

    def rate_count(self, rate: float, warmup: bool = False) -> int | None:
        """Requests of a rate level (measured, or warmup): a count, or K x the rate (K seconds' worth; for
        an infinite rate K x --max-inflight). None: the measured count is left to --duration."""
        n, x, k = (self.warmup, self.warmup_x, 2) if warmup else (self.num_prompts, self.num_prompts_x, 10)
        if n is not None:
            return n
        if x is None and self.duration_s is not None and not warmup:
            return None
        per = self.max_inflight if math.isinf(rate) else rate
        return max(0 if warmup else 1, round((k if x is None else x) * (per or 1)))

    def arrival(self) -> dict | None:
        """What the run records (and fingerprints) about its rate levels' schedule; None without any."""
        if not self.rates:
            return None
        return {"burstiness": self.burstiness, "max_inflight": self.max_inflight, "ramp_up_s": self.ramp_up_s,
                "duration_s": self.duration_s, "seed": self.workload.seed}

    def planned_levels(self) -> list[estimate.Level]:
        if self.workload.source == "trace":  # one level per trial: the whole trace
            return [estimate.Level(1, len(level_work.trace_offsets(self.workload)))] * self.trials
        closed = [estimate.Level(c, self.prompts_for(c) + self.warmup_for(c)) for c in self.levels]
        rate = [estimate.Level(self.max_inflight or 1, (self.rate_count(r) or round(r * (self.duration_s or 0)))
                               + (self.rate_count(r, warmup=True) or 0)) for r in self.rates if math.isfinite(r)]
        return [lv for lv in closed + rate for _ in range(self.trials)]

    def validate(self) -> None:
        """Every check, in one place: the declaration of the settings (`settings.validate`)."""
        settings.validate(self)


@dataclass
class LevelEvents:
    """Hooks the CLI uses to draw progress; all optional."""

    level_start: Callable[[int, int, int], Callable[[RequestRecord], None] | None] | None = None  # conc, trial, total
    level_done: Callable[[dict], None] | None = None
    message: Callable[[str], None] | None = None
    run_extra: Callable[[], dict] | None = None  # keys merged into the run's extra before it is finished


@dataclass(frozen=True)
class Level:
    """One level to measure: a concurrency (closed loop) or a rate (open loop, requests/s). Counts left
    None come from the config (prompts_for / warmup_for, rate_count)."""

    concurrency: int | None
    rate: float | None = None
    trial: int = 0
    num_prompts: int | None = None
    warmup: int | None = None


# Exit codes of `k2bench sweep` (and the meaning of SweepResult.exit_code)
EXIT_OK = 0  # every level valid
EXIT_INVALID = 1  # some level stored invalid (its reason is kept with it)
EXIT_USAGE = 2  # bad input: nothing was measured
EXIT_SERVER = 3  # the server died, stopped answering, or could not be used
EXIT_CRASH = crash.EXIT_CRASH  # an internal error (a bug): one line on stderr, the traceback in a file
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: the finished levels are kept
EXIT_CODES = ((EXIT_OK, "every level valid"), (EXIT_INVALID, "some level invalid (stored with its reason)"),
              (EXIT_USAGE, "bad input; nothing measured"),
              (EXIT_SERVER, "server problem (died, stopped answering, unusable answers); finished levels kept"),
              (EXIT_CRASH, "internal error (a bug; traceback saved to a file); finished levels kept"),
              (EXIT_INTERRUPTED, "interrupted (Ctrl-C, SIGTERM); finished levels kept"))


@dataclass
class SweepResult:
    run_id: int | None  # None: no level finished, so no run was stored
    status: str
    points: list[dict]
    meta: dict
    planned: int = 0  # levels x trials asked for
    exit_code: int = EXIT_OK
    problem: str | None = None  # why the sweep ended early (server death), for the CLI to print
    unmeasured: int = 0  # levels stopped during warmup (--level-timeout): not stored, but not valid either


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """A SIGTERM (CI cancelling a job) unwinds like Ctrl-C: the server is stopped, levels kept.

    A background job of a non-interactive shell (`k2bench sweep ... &` in a CI script) starts with
    SIGINT ignored; for the sweep, Python's Ctrl-C handler is put in place (and the ignoring restored
    after), so that asyncio's runner takes SIGINT over and both signals stop the sweep the same way."""
    def handler(signum, frame):
        # Forwarded as SIGINT rather than raised here: raised inside an event-loop transport callback,
        # uvloop swallows a KeyboardInterrupt (one request fails, the sweep carries on), while asyncio's
        # Runner turns a SIGINT into a clean cancel of the level. Outside a loop SIGINT raises as usual.
        signal.raise_signal(signal.SIGINT)

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    old_int = signal.getsignal(signal.SIGINT)
    if old_int == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
        if old_int == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _evaluate(cfg: SweepConfig, store, run_id: int, url: str, model: str, task: str, conc: int,
              say: Callable[[str], None]) -> None:
    """Accuracy on the same server after the levels (lm-eval, imported only when asked for)."""
    from k2bench.harness.eval.runner import run_eval

    say(f"eval {task} at concurrency {conc}")
    res = run_eval(url, task, limit=cfg.eval_limit, concurrency=conc, data=cfg.eval_data, model=model)
    store.add_eval(run_id, {"task": res.task, "metric": res.metric, "value": res.value, "stderr": res.stderr,
                            "n": res.n, "concurrency": conc, "items": res.items})
    say(f"eval {task}: {res.metric} {res.value:.4f} (n={res.n})")


@contextlib.contextmanager
def _telemetry(cfg: SweepConfig, srv: launch.ServerHandle, meta: dict, model_dir: Path | None,
               say: Callable[[str], None]) -> Iterator[LevelTelemetry]:
    """The run's telemetry (GPU power, the server's /metrics, the price, the roofline), recorded in
    the run's extra before the run is created; closed when the sweep ends."""
    from k2bench.harness.telemetry import roofline

    try:
        roof, why = roofline.for_run(model_dir, meta["hardware"], tp=cfg.tp, isl=meta["isl"], osl=meta["osl"],
                                     levels=tuple(cfg.levels), num_gpus=meta["num_gpus"])
    except UserError as exc:  # a model the byte/FLOP model does not describe: the sweep still runs
        roof, why = None, f"roofline off: {exc}"
    if why:
        say(why)
    server_env = {**os.environ, **(srv.launched.env if srv.launched else {})}
    tel = LevelTelemetry(cfg.telemetry, base_url=srv.url, server_env=server_env, hardware=meta["hardware"],
                         api_key=cfg.api_key, say=say, roof=roof)
    meta["extra"]["telemetry"] = tel.run_meta()
    if why:
        meta["extra"]["telemetry"]["notes"]["roofline"] = why
    meta["extra"]["roofline"] = roof
    try:
        yield tel
    finally:
        tel.close()


async def _unmetered(level):
    """(records, no client meters): a level run where the client does not measure itself (conversations)."""
    return await level, []


def run_sweep(cfg: SweepConfig, events: LevelEvents | None = None, plan: Iterable[Level] | None = None) -> SweepResult:
    """Measure every level, storing each as it finishes. The run is created with its first level, so
    a sweep that measured nothing leaves nothing behind. ``plan`` replaces the config's levels x trials
    with levels chosen as the sweep goes (the capacity search: the next is asked for once the last is
    stored)."""
    from k2bench.harness.measure.metrics import summarize_level
    from k2bench.harness.store import Store
    from k2bench.harness.store.heartbeat import Heartbeat

    cfg.validate()
    slo = parse_slo(cfg.slo) if cfg.slo else None
    if cfg.workload.turns > 1 and cfg.rates:
        raise UserError("conversations run as sessions under the closed loop (--conc); --rate cannot send them")
    if cfg.trace_time_scale != 1.0:
        if cfg.workload.source != "trace":
            raise UserError("--trace-time-scale applies to --trace only")
        cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, time_scale=cfg.trace_time_scale))
    if cfg.workload.path:  # a malformed dataset or trace is refused before a server starts
        from k2bench.workloads.datasets import check

        w = cfg.workload
        check(w.source, w.path, w.prompt_field, w.output_field)
    events = events or LevelEvents()
    say = events.message or (lambda text: None)
    store = Store.open(cfg.db)
    result = SweepResult(run_id=None, status="running", points=[], meta={},
                         planned=(1 if cfg.workload.source == "trace" else len(cfg.levels) + len(cfg.rates))
                         * cfg.trials)
    try:
        with _sigterm_as_interrupt(), contextlib.ExitStack() as stack, launch.open_server(
                url=cfg.url, engine=cfg.engine, model=cfg.model, tp=cfg.tp, server_args=cfg.server_args,
                log_dir=cfg.log_dir, ready_timeout_s=cfg.ready_timeout_s, api_key=cfg.api_key,
                server_cmd=cfg.server_cmd, cwd=cfg.server_cwd, say=say) as srv:
            request_model, vocab, meta, model_dir = _describe_run(cfg, srv, say)
            tel = stack.enter_context(_telemetry(cfg, srv, meta, model_dir, say))
            result.meta = meta
            w = cfg.workload
            say(f"{srv.engine} {meta['model']} on {meta['hardware']}, workload {w.name} "
                f"(ISL {w.isl}, OSL {w.osl}), levels {','.join(map(str, cfg.levels)) or '-'}"
                + (f", rates {','.join(f'{r:g}' for r in cfg.rates)} req/s" if cfg.rates else ""))
            speed = _probe_speed(cfg, srv.url, request_model, vocab)
            if speed is not None:
                seconds = estimate.sweep_seconds(cfg.planned_levels(), w.osl, speed)
                warning = estimate.too_long_warning(seconds, speed, w.isl, meta["hardware"].startswith("cpu"))
                say(warning or f"estimated duration: about {estimate.duration_text(seconds)}")
            sizer = ClientSizer(cfg.client_procs, speed.step_at if speed is not None else None)
            if plan is None:
                if w.source == "trace":  # one open-loop level per trial, sent at the trace's own times
                    plan = [Level(None, rate=level_work.trace_rate(w), trial=t) for t in range(cfg.trials)]
                else:
                    plan = [Level(c, trial=t) for c in cfg.levels for t in range(cfg.trials)]
                    plan += [Level(None, rate=r, trial=t) for r in cfg.rates for t in range(cfg.trials)]
            for lv in plan:
                conc, rate, trial = lv.concurrency, lv.rate, lv.trial
                watch = LevelWatch(server_gone=srv.death_note, timeout_s=cfg.level_timeout_s)
                if rate is None:
                    name = f"concurrency {conc}"
                    # one distinct prompt per request, warmup included: a server with prefix caching
                    # must not get measured requests it has already seen
                    work = level_work.plan(w, cfg.prompts_for(conc) if lv.num_prompts is None else lv.num_prompts,
                                           cfg.warmup_for(conc) if lv.warmup is None else lv.warmup, url=srv.url,
                                           model=request_model, vocab=vocab,
                                           seed=w.seed * 1_000_003 + conc * 1009 + trial)
                    n = work.planned
                    spec = LevelSpec(base_url=srv.url, model=request_model, concurrency=conc, num_prompts=n,
                                     num_warmup=work.warmup, timeout_s=cfg.timeout_s, api_key=cfg.api_key)
                    on_done = events.level_start(conc, trial, work.total) if events.level_start else None
                    if work.sessions is not None:  # conversations: sessions are the loop's users, one process
                        level = _unmetered(work.level(spec, on_done, watch, on_window=(tel.begin, tel.end)))
                    else:
                        level = procs.closed_level(spec, work.prompts or [], sizer.procs_for(conc), on_done, watch,
                                                   on_window=(tel.begin, tel.end))
                else:
                    name = f"rate {rate:g}/s"
                    if w.source == "trace":
                        prompts, offsets, warm = level_work.trace_prompts(w, vocab), level_work.trace_offsets(w), 0
                    else:
                        level_seed = schedule.level_seed(w.seed, rate, trial)
                        count = cfg.rate_count(rate) if lv.num_prompts is None else lv.num_prompts
                        warm = (cfg.rate_count(rate, warmup=True) or 0) if lv.warmup is None else lv.warmup
                        offsets, warm = schedule.level_schedule(rate, count, warm, cfg.burstiness, level_seed,
                                                                cfg.ramp_up_s, cfg.duration_s)
                        prompts = level_prompts(w, len(offsets), base_url=srv.url, model=request_model,
                                                vocab=vocab, seed=level_seed + 1)
                    n, conc = len(offsets) - warm, openloop.in_flight_cap(cfg.max_inflight, len(offsets))
                    spec = LevelSpec(base_url=srv.url, model=request_model, concurrency=conc, num_prompts=n,
                                     num_warmup=warm, timeout_s=cfg.timeout_s, api_key=cfg.api_key)
                    on_done = events.level_start(name, trial, len(offsets)) if events.level_start else None
                    level = procs_rate.rate_level(spec, prompts, offsets, rate, warm, cfg.max_inflight,
                                                  sizer.procs_for_rate(rate, w.osl, len(offsets)), on_done, watch,
                                                  on_window=(tel.begin, tel.end))
                try:
                    records, meters = run_async(level)
                finally:
                    tel.abort()  # a level cut short leaves no window open (a no-op after end())
                watch.name_the_exit()
                if watch.prompts_rejected:
                    raise UserError(f"{name}: {watch.stopped}\nthe prompts' token ids are not all in "
                                    f"the server's vocabulary: pass --model <folder or id> so prompts use the "
                                    f"server's vocabulary")
                failure = level_failure(records) if watch.stopped is None else None
                if failure:
                    died = srv.death_note()
                    raise ServerError(f"{name}: {failure}" + (f"\n{died}" if died else ""))
                if not any(not r.warmup for r in records):  # stopped before a measured request was sent
                    point = None
                    result.unmeasured += 1
                    say(f"{name}: nothing measured, stopped during warmup: {watch.stopped}")
                else:
                    point = summarize_level(records, concurrency=conc, num_gpus=meta["num_gpus"], trial=trial)
                    if rate is not None:
                        point.update(openloop.level_figures(records, rate))
                    point.update(tel.fields(point))
                    workload_metrics.prefer_server(point)
                    if slo is not None:
                        point.update(attainment(records, slo, duration_s=point["duration_s"],
                                                num_gpus=meta["num_gpus"]).fields())
                    client = selfmeasure.combine(meters) if meters else None
                    sizer.measured(conc if rate is None else None, records, client)
                    point.update(selfmeasure.point_fields(client))
                    point["valid"], point["invalid_reason"] = judge_level(point, records, cfg.rules, planned=n,
                                                                          stopped=watch.stopped)
                    if result.run_id is None:
                        result.run_id = store.create_run(meta)
                        stack.enter_context(Heartbeat(store, result.run_id))  # readers on any host see it live
                    store.add_point(result.run_id, point, records)
                    result.points.append(point)
                    if (cfg.profile_level and trial == 0 and not watch.server_down
                            and profile.parse(cfg.profile_level).concurrency == conc):
                        store.set_profile(result.run_id, profiled_pass(cfg, srv.url, request_model, vocab,
                                                                       profile.parse(cfg.profile_level), say))
                    if events.level_done:
                        events.level_done(point)
                if watch.server_down:
                    result.exit_code = EXIT_SERVER
                    result.problem = f"{name}: {watch.stopped}"
                    break
            if result.run_id is not None and result.exit_code == EXIT_OK:
                for task, conc in cfg.evals:
                    _evaluate(cfg, store, result.run_id, srv.url, request_model, task,
                              conc or max(cfg.levels or [cfg.max_inflight or 1]), say)
        if result.exit_code == EXIT_OK:
            result.status = "complete"
            if result.unmeasured or any(not p["valid"] for p in result.points):
                result.exit_code = EXIT_INVALID
    except KeyboardInterrupt:
        result.exit_code = EXIT_INTERRUPTED
    finally:
        try:
            if result.status != "complete":
                result.status = "partial" if any(p["valid"] for p in result.points) else "failed"
            if result.run_id is not None:
                if events.run_extra:
                    store.update_run_extra(result.run_id, events.run_extra())
                store.finish_run(result.run_id, result.status)
                if cfg.json_path:
                    from k2bench.harness.record import runjson

                    runjson.write_doc(store.export_run(result.run_id), cfg.json_path)
        finally:  # a failed finish or JSON write must not leave the database open
            store.close()
    return result


def _probe_speed(cfg: SweepConfig, url: str, model: str, vocab) -> estimate.Speed | None:
    """What a level costs on this server, for the up-front estimate of a large sweep (None for a sweep
    quick anywhere, or when the probe fails: the first level will then say why). One lone request
    (it also takes the server's cold start), then a small batch sent together: see k2bench.harness.plan.estimate."""

    from k2bench.harness.measure.metrics import request_metrics

    w = cfg.workload
    if w.source == "trace":  # a replay lasts the trace's own span; probing would send (and cache) its prompts
        return None
    if estimate.planned_tokens(cfg.planned_levels(), w.isl, w.osl) < estimate.PROBE_MIN_TOKENS:
        return None
    batch = min(estimate.PROBE_BATCH, min(cfg.levels or [estimate.PROBE_BATCH]))
    # seed + 1: levels use seed + conc x 1009 + trial, so the probe's prompts are not ones a level sends
    prompts = [dataclasses.replace(p, output_len=min(p.output_len, estimate.PROBE_OUTPUT_TOKENS))
               for p in level_prompts(w, 1 + batch, base_url=url, model=model, vocab=vocab,
                                      seed=w.seed * 1_000_003 + 1)[:1 + batch]]

    def send(conc: int, sent: list) -> list[dict]:
        spec = LevelSpec(base_url=url, model=model, concurrency=conc, num_prompts=len(sent), num_warmup=0,
                         timeout_s=cfg.timeout_s, api_key=cfg.api_key)
        return [request_metrics(rec, with_itl=False) for rec in run_async(run_level(spec, sent))]

    lone = send(1, prompts[:1])[0]
    together = send(batch, prompts[1:]) if batch > 1 else []
    return estimate.speed_from_probe(lone, together)


def _describe_run(cfg: SweepConfig, srv: launch.ServerHandle, say: Callable[[str], None]):
    """The model id to request, the vocabulary prompts draw from, what the run records, and the model
    folder (None when the server's model is not a local folder)."""
    served = srv.served_models
    request_model = cfg.model if cfg.model in served else (served[0] if served else (cfg.model or ""))
    model_dir: Path | None = (srv.model_dir or (Path(cfg.model) if cfg.model and Path(cfg.model).is_dir() else None)
                              or srv.model_root(request_model))
    vocab = prompt_gen.vocabulary_from_model_dir(model_dir) if model_dir else None
    w = cfg.workload
    meta = {
        "commit": cfg.commit if cfg.commit is not None else provenance.git_commit(),
        "branch": cfg.branch if cfg.branch is not None else provenance.git_branch(),
        "engine": srv.engine, "engine_version": srv.version,
        "engine_flags": redact.argv(srv.flags) if srv.flags else srv.flags,
        "server_command": redact.command(srv.command),
        "model": model_dir.name if model_dir else (cfg.model or request_model or "unknown"),
        "precision": cfg.precision or srv.precision or (provenance.precision_of(model_dir) if model_dir else None),
        "hardware": cfg.hardware or provenance.detect_hardware(), "num_gpus": cfg.gpus or cfg.tp, "tp": cfg.tp,
        "workload": w.name, "isl": w.isl, "osl": w.osl, "range_ratio": w.range_ratio,
        "workload_def": w.definition(),
        "tags": cfg.tags, "trials": cfg.trials, "notes": cfg.notes, "arrival": cfg.arrival(),
        "slo": parse_slo(cfg.slo).text if cfg.slo else None,  # canonical: equal SLOs read the same
        "extra": {"server_log": str(srv.log_path) if srv.log_path else None, "base_url": srv.url,
                  "request_model": request_model, "prompt_mode": w.mode,
                  "vocabulary": vocab.source if vocab else None, "versions": provenance.versions(),
                  "repro": repro.record(cfg.command_line, srv.command,
                                        repro.server_env(srv.launched.env) if srv.launched else None, srv.url, w)},
    }
    secrets = redact.sweep_secrets(cfg).add(*(srv.launched.secrets.values if srv.launched else ()))
    meta = redact.deep(meta, secrets)  # the last net: no secret the sweep was handed reaches the store
    if cfg.commit is None and meta["commit"] and provenance.git_dirty():
        meta["extra"]["git_dirty"] = True
        say(f"warning: tracked files differ from commit {meta['commit'][:12]}; the run is recorded "
            "against it with extra.git_dirty = true (commit first, or pass --commit)")
    return request_model, vocab, meta, model_dir
