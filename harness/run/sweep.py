"""A sweep: one server (attached or launched), one workload, a level per concurrency (x trials).

cli -> sweep -> (launch, workload, loadgen) -> metrics -> store. This module holds the run's flow:
the config is checked, the server comes from `launch.open_server`, what the run records about its
origin from `provenance`, a probe sizes the up-front estimate, then each planned level is run by
`level_run.LevelRunner` (its requests, load, figures and validity) and stored here as soon as it
finishes, so Ctrl-C or a crash keeps every finished level and the run is marked partial; a run with
no finished level is marked failed. What a sweep is asked, `SweepConfig`, lives in `run/config.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness import crash, redact
from k2bench.harness.load.client_size import ClientSizer
from k2bench.harness.load.loadgen import LevelSpec, run_level
from k2bench.harness.load.loadgen import run as run_async
from k2bench.harness.measure.slo import parse_slo
from k2bench.harness.plan import estimate
from k2bench.harness.record import provenance, repro
from k2bench.harness.run.config import SweepConfig
from k2bench.harness.run.level_run import Level, LevelRunner, LevelStart, planned
from k2bench.harness.run.profiled import profiled_pass
from k2bench.harness.servers import launch
from k2bench.harness.telemetry import profile
from k2bench.harness.telemetry.level import LevelTelemetry
from k2bench.workloads import prompts as prompt_gen
from k2bench.workloads.build import level_prompts


@dataclass
class LevelEvents:
    """Hooks the CLI uses to draw progress; all optional."""

    level_start: LevelStart | None = None  # (concurrency or rate name, trial, requests in all)
    level_done: Callable[[dict], None] | None = None
    message: Callable[[str], None] | None = None
    run_extra: Callable[[], dict] | None = None  # keys merged into the run's extra before it is finished


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


def run_sweep(cfg: SweepConfig, events: LevelEvents | None = None, plan: Iterable[Level] | None = None) -> SweepResult:
    """Measure every level, storing each as it finishes. The run is created with its first level, so
    a sweep that measured nothing leaves nothing behind. ``plan`` replaces the config's levels x trials
    with levels chosen as the sweep goes (the capacity search: the next is asked for once the last is
    stored)."""
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
            runner = LevelRunner(cfg, srv, model=request_model, vocab=vocab, num_gpus=meta["num_gpus"], tel=tel,
                                 sizer=ClientSizer(cfg.client_procs, speed.step_at if speed is not None else None),
                                 slo=slo, level_start=events.level_start)
            for lv in (planned(cfg) if plan is None else plan):
                done = runner.run(lv)
                if done.point is None:  # stopped during warmup: not stored, but not valid either
                    result.unmeasured += 1
                    say(f"{done.name}: nothing measured, stopped during warmup: {done.stopped}")
                else:
                    if result.run_id is None:
                        result.run_id = store.create_run(meta)
                        stack.enter_context(Heartbeat(store, result.run_id))  # readers on any host see it live
                    store.add_point(result.run_id, done.point, done.records)
                    result.points.append(done.point)
                    if (cfg.profile_level and lv.trial == 0 and not done.server_down
                            and profile.parse(cfg.profile_level).concurrency == done.concurrency):
                        store.set_profile(result.run_id, profiled_pass(cfg, srv.url, request_model, vocab,
                                                                       profile.parse(cfg.profile_level), say))
                    if events.level_done:
                        events.level_done(done.point)
                if done.server_down:
                    result.exit_code = EXIT_SERVER
                    result.problem = f"{done.name}: {done.stopped}"
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
