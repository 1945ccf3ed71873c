"""A sweep: one server (attached or launched), one workload, a level per concurrency (x trials).

cli -> sweep -> (launch, workload, loadgen) -> metrics -> store. Each level is summarised and
committed to the store as soon as it finishes, so Ctrl-C or a crash keeps every finished level
and the run is marked partial; a run with no finished level is marked failed.
"""

from __future__ import annotations

import contextlib
import math
import platform
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from k2bench.errors import ServerError, UserError
from k2bench.harness import launch, recipes
from k2bench.harness.loadgen import LevelSpec, level_failure, normalize_base_url, probe, run_level
from k2bench.harness.loadgen import run as run_async
from k2bench.harness.records import RequestRecord
from k2bench.workloads import loader as workloads

TINY_MODEL_DIR = Path("results/models/tiny-mxfp4")
MAX_CONCURRENCY = 1 << 16


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


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_commit() -> str | None:
    return _git("rev-parse", "HEAD")


def git_dirty() -> bool | None:
    """Whether tracked files differ from HEAD (the measured code is then not exactly the commit)."""
    out = _git("status", "--porcelain", "--untracked-files=no")
    if out is None:
        return None if git_commit() is None else False
    return bool(out)


def git_branch() -> str | None:
    branch = _git("rev-parse", "--abbrev-ref", "HEAD")
    return None if branch == "HEAD" else branch


def detect_hardware() -> str:
    """A short name for what the server runs on: the first GPU's name, else the CPU."""
    for argv in (["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                 ["rocm-smi", "--showproductname", "--csv"]):
        if shutil.which(argv[0]):
            try:
                out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                continue
            lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
            if out.returncode == 0 and lines:
                return lines[-1] if argv[0] == "rocm-smi" else lines[0]
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu}"


@dataclass
class SweepConfig:
    """Everything a sweep needs; the CLI fills it, tests build it directly."""

    levels: list[int]
    workload: workloads.Workload
    url: str | None = None
    engine: str | None = None
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

    def prompts_for(self, conc: int) -> int:
        if self.num_prompts is not None:
            return self.num_prompts
        return max(1, round((10 if self.num_prompts_x is None else self.num_prompts_x) * conc))

    def warmup_for(self, conc: int) -> int:
        if self.warmup is not None:
            return self.warmup
        return round((2 if self.warmup_x is None else self.warmup_x) * conc)

    def validate(self) -> None:
        if self.url and self.engine:
            raise UserError("give either --url (attach to a running server) or --engine (launch one), not both")
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


def ensure_tiny_model(path: Path = TINY_MODEL_DIR, say: Callable[[str], None] | None = None) -> Path:
    """The bundled tiny MXFP4 checkpoint, generated once (by the engine's own CLI) and cached."""
    if (path / "config.json").is_file():
        return path
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if say:
        say(f"generating the tiny MXFP4 model in {path} (once)")
    argv = [sys.executable, "-m", "k2bench.harness.cli", "engine", "tiny", "--out", str(tmp), "--quant", "mxfp4"]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0 or not (tmp / "config.json").is_file():
        tail = (out.stderr or out.stdout).strip().splitlines()[-5:]
        raise UserError(f"could not generate the tiny model ({' '.join(argv[2:])}): {' | '.join(tail)}")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def _precision_of(model_dir: Path) -> str | None:
    import json

    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    q = json.dumps(cfg.get("quantization_config") or {}).lower()
    if "nvfp4" in q:  # ModelOpt / compressed-tensors NVFP4: not the same format as MXFP4
        return "nvfp4"
    if "fp4" in q:  # Quark (Kimi-K2.5) and gpt-oss MXFP4
        return "mxfp4"
    if "fp8" in q:  # e.g. quant_method "fp8": the weights are not in torch_dtype
        return "fp8"
    return str(cfg.get("torch_dtype") or "bf16")


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
def _server(cfg: SweepConfig, say: Callable[[str], None]) -> Iterator[dict]:
    """Yield what the run records about the server: base_url, engine, version, flags, command..."""
    if cfg.url:
        base = normalize_base_url(cfg.url)
        served = run_async(probe(base, api_key=cfg.api_key))
        yield {"base_url": base, "engine": cfg.engine or "external", "engine_version": None,
               "engine_flags": None, "server_command": None, "served": served, "model_dir": None, "log": None,
               "died": lambda: None}
        return
    name = cfg.engine or "bundled"
    recipe = recipes.get(name)
    model = cfg.model or recipe.default_model
    if model is None:
        if name != "bundled":
            raise UserError(f"--engine {name} needs --model (a model path or hub id)")
        model = str(ensure_tiny_model(say=say))
    server = launch.from_recipe(name, model=model, tp=cfg.tp, extra_args=cfg.server_args, log_dir=cfg.log_dir,
                                ready_timeout_s=cfg.ready_timeout_s, api_key=cfg.api_key)
    say(f"starting {name}: {server.command}  (log: {server.log_path})")
    with server:
        served = run_async(probe(server.base_url, api_key=cfg.api_key))
        model_dir = Path(model) if Path(model).is_dir() else None
        yield {"base_url": server.base_url, "engine": name, "engine_version": server.version,
               "engine_flags": server.flags, "server_command": server.command, "served": served,
               "model_dir": model_dir, "log": str(server.log_path), "precision": recipe.precision,
               "died": lambda: _death_note(server)}


def _death_note(server: launch.Server) -> str | None:
    """If the launched server has exited, say so with its log tail (else None)."""
    code = server.proc.poll() if server.proc is not None else None
    if code is None:
        return None
    return f"the server exited with code {code}; last lines of {server.log_path}:\n{launch.log_tail(server.log_path)}"


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
        with _sigterm_as_interrupt(), _server(cfg, say) as srv:
            served = srv["served"]
            request_model = cfg.model if cfg.model in served else (served[0] if served else (cfg.model or ""))
            model_dir: Path | None = srv["model_dir"] or (Path(cfg.model) if cfg.model and Path(cfg.model).is_dir()
                                                          else None)
            vocab = workloads.vocabulary_from_model_dir(model_dir) if model_dir else None
            model_name = model_dir.name if model_dir else (cfg.model or request_model or "unknown")
            num_gpus = cfg.gpus or cfg.tp
            w = cfg.workload
            meta = {
                "commit": cfg.commit if cfg.commit is not None else git_commit(),
                "branch": cfg.branch if cfg.branch is not None else git_branch(),
                "engine": srv["engine"], "engine_version": srv["engine_version"],
                "engine_flags": srv["engine_flags"], "server_command": srv["server_command"],
                "model": model_name,
                "precision": cfg.precision or srv.get("precision") or (_precision_of(model_dir) if model_dir else None),
                "hardware": cfg.hardware or detect_hardware(), "num_gpus": num_gpus, "tp": cfg.tp,
                "workload": w.name, "isl": w.isl, "osl": w.osl, "range_ratio": w.range_ratio,
                "tags": cfg.tags, "trials": cfg.trials, "notes": cfg.notes,
                "extra": {"server_log": srv["log"], "base_url": srv["base_url"], "request_model": request_model,
                          "prompt_mode": w.mode, "vocabulary": vocab.source if vocab else None},
            }
            if cfg.commit is None and meta["commit"] and git_dirty():
                meta["extra"]["git_dirty"] = True
                say(f"warning: tracked files differ from commit {meta['commit'][:12]}; the run is recorded "
                    "against it with extra.git_dirty = true (commit first, or pass --commit)")
            run_id = store.create_run(meta)
            say(f"run {run_id}: {srv['engine']} {model_name} on {meta['hardware']}, workload {w.name} "
                f"(ISL {w.isl}, OSL {w.osl}), levels {','.join(map(str, cfg.levels))}")
            for conc in cfg.levels:
                for trial in range(cfg.trials):
                    n, warm = cfg.prompts_for(conc), cfg.warmup_for(conc)
                    # one distinct prompt per request, warmup included: a server with prefix caching
                    # must not get measured requests it has already seen
                    prompts = workloads.build_prompts(w, n + warm, base_url=srv["base_url"], model=request_model,
                                                      vocab=vocab, seed=w.seed * 1_000_003 + conc * 1009 + trial)
                    spec = LevelSpec(base_url=srv["base_url"], model=request_model, concurrency=conc,
                                     num_prompts=n, num_warmup=warm, timeout_s=cfg.timeout_s, api_key=cfg.api_key)
                    on_done = events.level_start(conc, trial, n + warm) if events.level_start else None
                    records = run_async(run_level(spec, prompts, on_done))
                    reason = level_failure(records)
                    if reason:
                        died = srv["died"]()
                        raise ServerError(f"concurrency {conc}: {reason}" + (f"\n{died}" if died else ""))
                    point = summarize_level(records, concurrency=conc, num_gpus=num_gpus, trial=trial)
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

