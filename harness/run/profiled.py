"""The profiled pass of --profile-level C[:N]: N requests at concurrency C inside the server's profiler,
sent after level C's measured requests (k2bench.harness.telemetry.profile says why apart)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from k2bench.harness.load.loadgen import LevelSpec, run_level
from k2bench.harness.load.loadgen import run as run_async
from k2bench.harness.telemetry import profile
from k2bench.workloads import prompts as prompt_gen


def output_dir(log_dir: str, conc: int) -> str:
    """Where the server is asked to write: beside the launched servers' logs, one folder per pass."""
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{time.monotonic_ns() % 1_000_000:06d}"
    return str((Path(log_dir) / "profiles" / f"{stamp}-c{conc}").resolve())


def profiled_pass(cfg: Any, url: str, model: str, vocab: Any, level: profile.ProfileLevel,
                  say: Callable[[str], None]) -> dict:
    """Run the pass; return what the run keeps in its ``profile`` field (with ``error`` when the server's
    profiler could not be used: the sweep goes on without a profile)."""
    n, conc = level.requests_for(), level.concurrency
    w = cfg.workload
    # seed + 2: levels use seed + conc x 1009 + trial and the speed probe seed + 1, so these prompts are new
    prompts = prompt_gen.build_prompts(w, n, base_url=url, model=model, vocab=vocab, seed=w.seed * 1_000_003 + 2)
    spec = LevelSpec(base_url=url, model=model, concurrency=conc, num_prompts=n, num_warmup=0,
                     timeout_s=cfg.timeout_s, api_key=cfg.api_key)
    out = {"concurrency": conc, "requests": n, "completed": 0, "note": profile.NOTE}
    where = output_dir(cfg.log_dir, conc)
    say(f"profiling {n} request(s) at concurrency {conc}")
    try:
        profile.start(url, where, cfg.api_key)
    except profile.ProfilerUnavailable as exc:
        say(f"no profile: {exc}")
        return {**out, "error": str(exc)}
    try:
        records = run_async(run_level(spec, prompts))
    finally:
        try:
            answer = profile.stop(url, cfg.api_key)
        except profile.ProfilerUnavailable as exc:
            answer = {"error": str(exc)}
    out["completed"] = sum(1 for r in records if r.success)
    out.update({"output_dir": where, **answer})
    if out.get("error"):
        say(f"no profile: {out['error']}")
    elif out.get("trace"):
        say(f"profile: trace {out['trace']}")
    return out
