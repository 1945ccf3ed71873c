"""The bundled engine's profiler: POST /start_profile and /stop_profile (the endpoints vLLM and SGLang
serve), backed by torch.profiler, writing a Chrome trace and a kernel-time summary.

torch.profiler records only the thread that starts it, so the engine thread starts and stops it,
between two steps (`AsyncEngine.call`). While it records, the engine's step phases are labelled with
`record_function` (SECTIONS: ``engine.schedule``, ``engine.forward``, ``engine.sample``, ...), so the
summary names the engine function as well as the aten ops and kernels beneath it. The labels are put
on the instances only while profiling: a step outside a profile pays nothing for them.

The summary (``k2bench.profile/1``) lists per op or kernel its calls, self and total time in µs and
its self time per engine step of the window (CPU ops by CPU time; CUDA kernels by device time). It is
sorted by self time, capped at MAX_OPS entries. Tensor-parallel workers other than rank 0 are not
profiled.

K2BENCH_TEST_SLOW=SECTION:MS (tests only) makes one section take MS milliseconds longer per call, so
that tests can show a slowed function at the top of `k2bench profile-diff`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from k2bench.engine.runtime.protocol import RequestError

log = logging.getLogger(__name__)

# label -> (attribute of LLMEngine, method of that object)
SECTIONS: dict[str, tuple[str, str]] = {
    "engine.schedule": ("scheduler", "schedule"),
    "engine.prepare": ("runner", "prepare"),
    "engine.forward": ("runner", "execute"),
    "engine.sample": ("runner", "sample_launch"),
    "engine.read": ("runner", "wait_tokens"),  # waits for the device: the step's tokens come back to the host
    "engine.postprocess": ("scheduler", "postprocess"),
}
SLOW_ENV = "K2BENCH_TEST_SLOW"
DIR_ENV = "K2BENCH_PROFILE_DIR"  # where traces go when /start_profile names no output_dir
FORMAT = "k2bench.profile/1"
MAX_OPS = 200


class ProfileError(RuntimeError):
    """A profiler request that cannot be honoured now (the server answers 400)."""


def _wrap(engine: Any, label: str, make: Callable[[Callable], Callable]) -> Callable[[], None]:
    """Replace one section's method on its instance with ``make(method)``; return the undo."""
    owner_name, meth = SECTIONS[label]
    owner = getattr(engine, owner_name)
    had_own = meth in vars(owner)
    inner = getattr(owner, meth)
    setattr(owner, meth, make(inner))

    def undo() -> None:
        if had_own:
            setattr(owner, meth, inner)
        else:
            delattr(owner, meth)
    return undo


def slow_switch() -> tuple[str, float] | None:
    """The K2BENCH_TEST_SLOW switch as (section, seconds), None when unset; ValueError when malformed."""
    raw = os.environ.get(SLOW_ENV, "").strip()
    if not raw:
        return None
    label, _, ms = raw.partition(":")
    if label not in SECTIONS:
        raise ValueError(f"{SLOW_ENV}={raw!r}: the section must be one of {', '.join(SECTIONS)}")
    try:
        seconds = float(ms) / 1000
    except ValueError:
        raise ValueError(f"{SLOW_ENV}={raw!r}: write SECTION:MILLISECONDS, e.g. engine.sample:20") from None
    if not seconds > 0:
        raise ValueError(f"{SLOW_ENV}={raw!r}: the delay must be positive")
    return label, seconds


def apply_test_delay(engine: Any) -> None:
    """Slow one section for good when the test switch is set (a stand-in for a slower commit)."""
    delay = slow_switch()
    if delay is None:
        return
    label, seconds = delay

    def make(inner: Callable) -> Callable:
        @functools.wraps(inner)
        def slowed(*args, **kwargs):
            time.sleep(seconds)
            return inner(*args, **kwargs)
        return slowed

    _wrap(engine, label, make)
    log.warning("test switch %s: %s takes %.1f ms longer per call", SLOW_ENV, label, seconds * 1000)


def _labelled(label: str) -> Callable[[Callable], Callable]:
    def make(inner: Callable) -> Callable:
        from torch.profiler import record_function

        @functools.wraps(inner)
        def run(*args, **kwargs):
            with record_function(label):
                return inner(*args, **kwargs)
        return run
    return make


def default_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or Path(tempfile.gettempdir()) / "k2bench-profiles")


class EngineProfiler:
    """One profile at a time. `start` and `stop` run in the engine thread; `finish` (writing the trace
    and the summary, slow for a long window) runs anywhere after `stop`."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._prof = None
        self._undo: list[Callable[[], None]] = []
        self._out: Path | None = None
        self._steps0 = 0
        self._t0 = 0.0

    @property
    def active(self) -> bool:
        return self._prof is not None

    def start(self, out_dir: Path) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self._prof is not None:
            raise ProfileError("the profiler is already running: POST /stop_profile first")
        out_dir.mkdir(parents=True, exist_ok=True)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._undo = [_wrap(self.engine, label, _labelled(label)) for label in SECTIONS]
        prof = profile(activities=acts)
        prof.start()
        self._prof, self._out = prof, out_dir
        self._steps0, self._t0 = self.engine.stats.steps, time.monotonic()

    def stop(self) -> tuple[Any, Path, int, float]:
        """Stop recording; return what `finish` needs."""
        if self._prof is None:
            raise ProfileError("the profiler is not running: POST /start_profile first")
        prof, out = self._prof, self._out
        prof.stop()
        for undo in reversed(self._undo):
            undo()
        self._prof, self._undo = None, []
        assert out is not None
        return prof, out, self.engine.stats.steps - self._steps0, time.monotonic() - self._t0


def finish(prof: Any, out: Path, steps: int, seconds: float) -> dict:
    """Write the Chrome trace and the summary next to it; return both paths and the summary."""
    import torch

    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}-{time.monotonic_ns() % 1_000_000:06d}"
    trace = out / f"trace-{stamp}.json"
    prof.export_chrome_trace(str(trace))
    summary = summarize(prof.key_averages(), steps, seconds, "cuda" if torch.cuda.is_available() else "cpu")
    summary_path = out / f"summary-{stamp}.json"
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    return {"trace": str(trace.resolve()), "summary_path": str(summary_path.resolve()), "summary": summary}


def summarize(events: Any, steps: int, seconds: float, device: str) -> dict:
    """Per op or kernel: calls, self and total µs, self µs per engine step (``k2bench.profile/1``)."""
    ops = []
    for e in events:
        if not e.count:
            continue
        if str(getattr(e, "device_type", "")).rsplit(".", 1)[-1].upper() == "CUDA":
            kind = "cuda"
            self_us = float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))
            total_us = float(getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0)))
        else:
            kind, self_us, total_us = "cpu", float(e.self_cpu_time_total), float(e.cpu_time_total)
        ops.append({"name": e.key, "kind": kind, "calls": int(e.count), "self_us": round(self_us, 3),
                    "total_us": round(total_us, 3),
                    "self_us_per_step": round(self_us / steps, 3) if steps else None})
    ops.sort(key=lambda op: op["self_us"], reverse=True)
    return {"format": FORMAT, "device": device, "steps": steps, "window_s": round(seconds, 6),
            "ops_total": len(ops), "ops": ops[:MAX_OPS]}


class ProfileEndpoints:
    """The aiohttp handlers of /start_profile and /stop_profile for an OpenAIServer.

    /start_profile takes an optional JSON body ``{"output_dir": DIR}`` (SGLang's field; default
    K2BENCH_PROFILE_DIR, else a folder under the system's temporary directory). /stop_profile answers
    ``{"trace", "summary_path", "summary"}`` once both files are written."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.profiler = EngineProfiler(server.engine)

    def add_routes(self, app: Any) -> None:
        app.router.add_post("/start_profile", self.start)
        app.router.add_post("/stop_profile", self.stop)

    async def start(self, request: Any) -> Any:
        body = await self.server._json(request) if request.can_read_body else {}
        out = body.get("output_dir") or default_dir()
        if not isinstance(out, str | Path):
            raise RequestError("'output_dir' must be a string", "output_dir")
        engine = self._engine()
        try:
            await engine.call(lambda: self.profiler.start(Path(out)))
        except (ProfileError, OSError) as exc:
            raise RequestError(str(exc)) from None
        return web.json_response({"profiling": True, "output_dir": str(Path(out).resolve())})

    async def stop(self, request: Any) -> Any:
        try:
            stopped = await self._engine().call(self.profiler.stop)
        except ProfileError as exc:
            raise RequestError(str(exc)) from None
        result = await asyncio.get_running_loop().run_in_executor(None, finish, *stopped)
        return web.json_response(result)

    def _engine(self) -> Any:
        engine = self.server.async_engine
        if engine is None or engine.fatal:
            raise RequestError("the engine is not running", status=503)
        return engine
