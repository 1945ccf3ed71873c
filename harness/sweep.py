"""A sweep: one server (attached or launched), one workload, a level per concurrency (x trials).

cli -> sweep -> (launch, workload, loadgen) -> metrics -> store. This module holds the level loop;
the server comes from `launch.open_server`, what the run records about its origin from
`provenance`, the prompts from `k2bench.workloads.prompts`. Each level is summarised and
committed to the store as soon as it finishes, so Ctrl-C or a crash keeps every finished level
and the run is marked partial; a run with no finished level is marked failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from k2bench.errors import ServerError, UserError
from k2bench.harness import launch, provenance
from k2bench.harness.loadgen import LevelSpec, level_failure, run_level
from k2bench.harness.loadgen import run as run_async
from k2bench.harness.records import RequestRecord
from k2bench.harness.telemetry.level import LevelTelemetry, TelemetryConfig
from k2bench.workloads import prompts as prompt_gen
from k2bench.workloads.loader import Workload


@dataclass
class SweepConfig:
    """Everything a sweep needs; the CLI fills it, tests build it directly."""

    levels: list[int]
    workload: Workload
    url: str | None = None
    engine: str | None = None
    server_cmd: str | None = None  # launch this command line instead of a recipe (the custom recipe)
    server_cwd: str | None = None  # where the launched server runs (a backfilled commit's worktree)
    model: str | None = None
    tp: int = 1
    num_prompts: int | None = None  # per level; default 10 x concurrency
    warmup: int | None = None  # per level; default 2 x concurrency
    num_prompts_x: float | None = None  # per level as a multiple of the concurrency ("--num-prompts 1x")
    warmup_x: float | None = None  # likewise for --warmup
    trials: int = 1
    db: str | None = None
    json_path: str | None = None
    commit: str | None = None
    branch: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    timeout_s: float = 1800.0
    server_args: str | None = None
    precision: str | None = None
    hardware: str | None = None
    ready_timeout_s: float | None = None
    log_dir: str = "results/logs"
    api_key: str | None = None
    notes: str | None = None
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)  # GPU power, server metrics, price

    def prompts_for(self, conc: int) -> int:
        if self.num_prompts is not None:
            return self.num_prompts
        return max(1, round((10 if self.num_prompts_x is None else self.num_prompts_x) * conc))

    def warmup_for(self, conc: int) -> int:
        if self.warmup is not None:
            return self.warmup
        return round((2 if self.warmup_x is None else self.warmup_x) * conc)

    def validate(self) -> None:
        given = [flag for flag, v in (("--url", self.url), ("--engine", self.engine),
                                      ("--server-cmd", self.server_cmd)) if v]
        if len(given) > 1:
            raise UserError(f"give either --url (attach to a running server) or --engine / --server-cmd (launch "
                            f"one), not both ({' and '.join(given)})")
        for name in ("tp", "trials"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name} must be at least 1")
        if self.gpus is not None and self.gpus < 1:
            raise UserError("--gpus must be at least 1")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise UserError("--num-prompts must be at least 1")
        if self.warmup is not None and self.warmup < 0:
            raise UserError("--warmup must be 0 or more")
        if self.num_prompts_x is not None and self.num_prompts_x <= 0:
            raise UserError("--num-prompts as a multiple of the concurrency must be positive (e.g. 1x)")
        if self.warmup_x is not None and self.warmup_x < 0:
            raise UserError("--warmup as a multiple of the concurrency must be 0 or more (e.g. 0.5x)")
        if self.timeout_s <= 0:
            raise UserError("--timeout must be positive")
        if not self.levels:
            raise UserError("--conc gave no levels")
        self.telemetry.validate()


@dataclass
class LevelEvents:
    """Hooks the CLI uses to draw progress; all optional."""

    level_start: Callable[[int, int, int], Callable[[RequestRecord], None] | None] | None = None  # conc, trial, total
    level_done: Callable[[dict], None] | None = None
    message: Callable[[str], None] | None = None


@dataclass
class SweepResult:
    run_id: int
    status: str
    points: list[dict]
    meta: dict


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """A SIGTERM (CI cancelling a job) unwinds like Ctrl-C: the server is stopped, levels kept."""
    def handler(signum, frame):
        # Forwarded as SIGINT rather than raised here: raised inside an event-loop transport callback,
        # uvloop swallows a KeyboardInterrupt (one request fails, the sweep carries on), while asyncio's
        # Runner turns a SIGINT into a clean cancel of the level. Outside a loop SIGINT raises as usual.
        if callable(signal.getsignal(signal.SIGINT)):
            signal.raise_signal(signal.SIGINT)
        else:  # SIGINT ignored (a background job of a shell): no way to forward it
            raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


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


def run_sweep(cfg: SweepConfig, events: LevelEvents | None = None) -> SweepResult:
    from k2bench.harness.metrics import summarize_level
    from k2bench.harness.store import Store

    cfg.validate()
    events = events or LevelEvents()
    say = events.message or (lambda text: None)
    store = Store.open(cfg.db)
    run_id: int | None = None
    points: list[dict] = []
    status = "failed"
    meta: dict = {}
    try:
        with _sigterm_as_interrupt(), contextlib.ExitStack() as stack, launch.open_server(
                url=cfg.url, engine=cfg.engine, model=cfg.model, tp=cfg.tp, server_args=cfg.server_args,
                log_dir=cfg.log_dir, ready_timeout_s=cfg.ready_timeout_s, api_key=cfg.api_key,
                server_cmd=cfg.server_cmd, cwd=cfg.server_cwd, say=say) as srv:
            served = srv.served_models
            request_model = cfg.model if cfg.model in served else (served[0] if served else (cfg.model or ""))
            model_dir: Path | None = srv.model_dir or (Path(cfg.model) if cfg.model and Path(cfg.model).is_dir()
                                                       else None)
            vocab = prompt_gen.vocabulary_from_model_dir(model_dir) if model_dir else None
            model_name = model_dir.name if model_dir else (cfg.model or request_model or "unknown")
            num_gpus = cfg.gpus or cfg.tp
            w = cfg.workload
            meta = {
                "commit": cfg.commit if cfg.commit is not None else provenance.git_commit(),
                "branch": cfg.branch if cfg.branch is not None else provenance.git_branch(),
                "engine": srv.engine, "engine_version": srv.version,
                "engine_flags": srv.flags, "server_command": srv.command,
                "model": model_name,
                "precision": cfg.precision or srv.precision or (provenance.precision_of(model_dir) if model_dir
                                                                else None),
                "hardware": cfg.hardware or provenance.detect_hardware(), "num_gpus": num_gpus, "tp": cfg.tp,
                "workload": w.name, "isl": w.isl, "osl": w.osl, "range_ratio": w.range_ratio,
                "tags": cfg.tags, "trials": cfg.trials, "notes": cfg.notes,
                "extra": {"server_log": str(srv.log_path) if srv.log_path else None, "base_url": srv.url,
                          "request_model": request_model, "prompt_mode": w.mode,
                          "vocabulary": vocab.source if vocab else None, "versions": provenance.versions()},
            }
            tel = stack.enter_context(_telemetry(cfg, srv, meta, model_dir, say))
            if cfg.commit is None and meta["commit"] and provenance.git_dirty():
                meta["extra"]["git_dirty"] = True
                say(f"warning: tracked files differ from commit {meta['commit'][:12]}; the run is recorded "
                    "against it with extra.git_dirty = true (commit first, or pass --commit)")
            run_id = store.create_run(meta)
            say(f"run {run_id}: {srv.engine} {model_name} on {meta['hardware']}, workload {w.name} "
                f"(ISL {w.isl}, OSL {w.osl}), levels {','.join(map(str, cfg.levels))}")
            for conc in cfg.levels:
                for trial in range(cfg.trials):
                    n, warm = cfg.prompts_for(conc), cfg.warmup_for(conc)
                    # one distinct prompt per request, warmup included: a server with prefix caching
                    # must not get measured requests it has already seen
                    prompts = prompt_gen.build_prompts(w, n + warm, base_url=srv.url, model=request_model,
                                                       vocab=vocab, seed=w.seed * 1_000_003 + conc * 1009 + trial)
                    spec = LevelSpec(base_url=srv.url, model=request_model, concurrency=conc,
                                     num_prompts=n, num_warmup=warm, timeout_s=cfg.timeout_s, api_key=cfg.api_key)
                    on_done = events.level_start(conc, trial, n + warm) if events.level_start else None
                    try:
                        records = run_async(run_level(spec, prompts, on_done, on_window=(tel.begin, tel.end)))
                    finally:
                        tel.abort()  # a level cut short leaves no window open (a no-op after end())
                    reason = level_failure(records)
                    if reason:
                        died = srv.death_note()
                        raise ServerError(f"concurrency {conc}: {reason}" + (f"\n{died}" if died else ""))
                    point = summarize_level(records, concurrency=conc, num_gpus=num_gpus, trial=trial)
                    point.update(tel.fields(point))
                    store.add_point(run_id, point, records)
                    points.append(point)
                    if events.level_done:
                        events.level_done(point)
        status = "complete"
    finally:
        try:
            if run_id is not None:
                if status != "complete":
                    status = "partial" if points else "failed"
                store.finish_run(run_id, status)
                if cfg.json_path:
                    from k2bench.harness import runjson

                    runjson.write_doc(store.export_run(run_id), cfg.json_path)
        finally:  # a failed finish or JSON write must not leave the database open
            store.close()
    return SweepResult(run_id=run_id, status=status, points=points, meta=meta)

