"""Engine recipes: how to start each server, as data (argv template, environment, version probe).

Placeholders in argv: {python} (this interpreter), {model}, {tp}, {host}, {port}. A recipe's
``flags`` are the arguments that change what is measured (recorded with the run and part of its
fingerprint); extra arguments given with ``--server-args`` are appended and recorded too.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field

from k2bench.errors import UserError


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    argv: tuple[str, ...]  # the command, without flags
    flags: tuple[str, ...] = ()  # fixed tuning flags, recorded as engine_flags
    env: dict[str, str] = field(default_factory=dict)
    version_argv: tuple[str, ...] | None = None  # prints the engine version
    precision: str | None = None
    ready_timeout_s: float = 600.0  # loading a 1T-parameter checkpoint takes minutes
    default_model: str | None = None  # used when --model is not given


def _py(code: str) -> tuple[str, ...]:
    return ("{python}", "-c", code)


def _dist_version(dist: str) -> tuple[str, ...]:
    return _py(f"import importlib.metadata as m; print(m.version({dist!r}))")


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            name="bundled",
            description="k2bench's own MXFP4 engine (k2bench serve), run as a server process",
            argv=("{python}", "-m", "k2bench.harness.cli", "serve", "--model", "{model}", "--tp", "{tp}",
                  "--host", "{host}", "--port", "{port}"),
            version_argv=("{python}", "-m", "k2bench.harness.cli", "--version"),
            ready_timeout_s=900.0,
        ),
        Recipe(
            name="atom",
            description="AMD ATOM, flags and environment as InferenceX runs Kimi-K2.5 MXFP4 on MI355X",
            argv=("python3", "-m", "atom.entrypoints.openai_server", "--model", "{model}",
                  "--server-port", "{port}", "-tp", "{tp}"),
            flags=("--scheduler-delay-factor", "1", "--kv_cache_dtype", "fp8", "--max-model-len", "10240",
                   "--trust-remote-code"),
            env={"ATOM_DISABLE_MMAP": "true", "AITER_QUICK_REDUCE_QUANTIZATION": "INT4",
                 "AITER_MXFP4_INTERMEDIATE": "1", "OMP_NUM_THREADS": "1"},
            version_argv=_dist_version("atom"),
            precision="mxfp4",
            ready_timeout_s=3600.0,
        ),
        Recipe(
            name="vllm",
            description="vLLM (vllm serve), without prefix caching so repeated prompts are not free",
            argv=("vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}",
                  "--tensor-parallel-size", "{tp}"),
            flags=("--gpu-memory-utilization", "0.90", "--no-enable-prefix-caching", "--trust-remote-code"),
            version_argv=_dist_version("vllm"),
            ready_timeout_s=3600.0,
        ),
        Recipe(
            name="sglang",
            description="SGLang (python -m sglang.launch_server), radix cache off",
            argv=("python3", "-m", "sglang.launch_server", "--model-path", "{model}", "--host", "{host}",
                  "--port", "{port}", "--tp", "{tp}"),
            flags=("--disable-radix-cache", "--trust-remote-code"),
            version_argv=_dist_version("sglang"),
            ready_timeout_s=3600.0,
        ),
        Recipe(
            name="testserver",
            description="k2bench's controllable test server (known TTFT and token gap; no model)",
            argv=("{python}", "-m", "k2bench.harness.testserver", "--host", "{host}", "--port", "{port}",
                  "--model", "{model}"),
            version_argv=("{python}", "-m", "k2bench.harness.cli", "--version"),
            ready_timeout_s=60.0,
            default_model="k2bench-test",
        ),
    )
}


def get(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise UserError(f"unknown engine recipe {name!r}; known: {', '.join(sorted(RECIPES))}") from None


def _fill(parts: tuple[str, ...], values: dict[str, str]) -> list[str]:
    return [p.format(**values) for p in parts]


def render(recipe: Recipe, *, model: str, tp: int, port: int, host: str = "127.0.0.1",
           extra_args: str | list[str] | None = None) -> tuple[list[str], list[str]]:
    """The full command line and the flags to record (recipe flags + extra arguments)."""
    extra = shlex.split(extra_args) if isinstance(extra_args, str) else list(extra_args or [])
    values = {"python": sys.executable, "model": model, "tp": str(tp), "host": host, "port": str(port)}
    flags = list(recipe.flags) + extra
    return _fill(recipe.argv, values) + flags, flags


def version_command(recipe: Recipe) -> list[str] | None:
    if recipe.version_argv is None:
        return None
    return _fill(recipe.version_argv, {"python": sys.executable})
