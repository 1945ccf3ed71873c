"""Engine recipes: how to start each server, as data (argv template, environment, version probe).

Placeholders in argv: {python} (this interpreter), {model}, {tp}, {host}, {port}. Besides the
built-ins, a ``custom`` recipe comes from ``--server-cmd`` and user recipe files (TOML, the same
fields) in a recipes folder add to or override the built-ins. A recipe's
``flags`` are the arguments that change what is measured (recorded with the run and part of its
fingerprint); extra arguments given with ``--server-args`` are appended and recorded too.
"""

from __future__ import annotations

import os
import shlex
import string
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

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
    source: str = "built-in"  # or the user recipe file it came from
    record_command: bool = False  # record the argv template among the flags (a --server-cmd: it is the config)


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
            # no prefix-caching flag: the engine's default (off) matches the vLLM and SGLang recipes, and a run
            # turns it on with --server-args=--enable-prefix-caching (recorded, so in the fingerprint)
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
            argv=("{python}", "-m", "k2bench.harness.load.testserver", "--host", "{host}", "--port", "{port}",
                  "--model", "{model}"),
            version_argv=("{python}", "-m", "k2bench.harness.cli", "--version"),
            ready_timeout_s=60.0,
            default_model="k2bench-test",
        ),
    )
}


CUSTOM = "custom"
PLACEHOLDERS = ("python", "model", "tp", "host", "port")
RECIPES_ENV = "K2BENCH_RECIPES"  # folder of user recipe files; default ./recipes when it exists
_TOML_FIELDS = {"name", "extends", "description", "argv", "command", "flags", "env", "version_argv",
                "precision", "ready_timeout_s", "default_model"}


def recipes_dir(folder: str | Path | None = None) -> Path | None:
    """The user recipe folder: the argument, else $K2BENCH_RECIPES, else ./recipes if it exists."""
    if folder is not None:
        return Path(folder)
    env = os.environ.get(RECIPES_ENV)
    if env:
        return Path(env)
    default = Path("recipes")
    return default if default.is_dir() else None


def _check_placeholders(parts: tuple[str, ...], where: str) -> None:
    for part in parts:
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(part) if f is not None]
        except ValueError as exc:
            raise UserError(f"{where}: {part!r}: {exc} (write {{{{ and }}}} for literal braces)") from None
        bad = [n for n in names if n not in PLACEHOLDERS]
        if bad:
            raise UserError(f"{where}: unknown placeholder {{{bad[0]}}}; known: "
                            + ", ".join("{" + n + "}" for n in PLACEHOLDERS))


def custom(server_cmd: str, *, name: str = CUSTOM) -> Recipe:
    """The recipe of a ``--server-cmd`` string: any engine, launched without a code change.

    The command must listen on ``{port}`` (k2bench picks a free one); {host} {model} {tp} {python}
    are filled in too. The recorded flags (part of the fingerprint) are the command as written, so
    runs of two different commands never compare, and runs of one command always do.
    """
    try:
        argv = tuple(shlex.split(server_cmd))
    except ValueError as exc:
        raise UserError(f"--server-cmd: cannot split {server_cmd!r}: {exc}") from None
    if not argv:
        raise UserError("--server-cmd is empty")
    _check_placeholders(argv, "--server-cmd")
    if not any("{port}" in part for part in argv):
        raise UserError("--server-cmd must contain {port}: k2bench chooses a free port and the server has to "
                        "listen on it")
    return Recipe(name=name, description="a server command given with --server-cmd", argv=argv,
                  ready_timeout_s=3600.0, default_model="default", record_command=True)


def _str_tuple(value, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str) and key in ("argv", "version_argv"):
        value = shlex.split(value)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: {key} must be a list of strings")
    return tuple(value)


def _from_toml(path: Path, known: dict[str, Recipe]) -> Recipe:
    """A user recipe file: the built-in fields, optionally ``extends = "vllm"`` to change a few of them."""
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"recipe file {path}: {exc}") from None
    unknown = sorted(set(doc) - _TOML_FIELDS)
    if unknown:
        raise UserError(f"recipe file {path}: unknown field {unknown[0]!r}; known: {', '.join(sorted(_TOML_FIELDS))}")
    name = doc.pop("name", path.stem)
    base_name = doc.pop("extends", None)
    if base_name is not None and base_name not in known:
        raise UserError(f"recipe file {path}: extends unknown recipe {base_name!r}; known: {', '.join(sorted(known))}")
    if "command" in doc:
        if "argv" in doc:
            raise UserError(f"recipe file {path}: give argv or command, not both")
        doc["argv"] = shlex.split(str(doc.pop("command")))
    values: dict = {}
    for key, value in doc.items():
        if key in ("argv", "flags", "version_argv"):
            values[key] = _str_tuple(value, key, f"recipe file {path}")
        elif key == "env":
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise UserError(f"recipe file {path}: env must be a table of strings")
            values[key] = dict(value)
        elif key == "ready_timeout_s":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise UserError(f"recipe file {path}: ready_timeout_s must be a positive number")
            values[key] = float(value)
        elif not isinstance(value, str):
            raise UserError(f"recipe file {path}: {key} must be a string")
        else:
            values[key] = value
    if base_name is not None:
        recipe = replace(known[base_name], name=name, **values)
    else:
        if "argv" not in values:
            raise UserError(f"recipe file {path}: needs argv (or command), or extends = \"<recipe>\"")
        values.setdefault("description", f"user recipe ({path})")
        recipe = Recipe(name=name, **values)
    for key in ("argv", "flags"):
        _check_placeholders(getattr(recipe, key), f"recipe file {path}: {key}")
    if not any("{port}" in part for part in recipe.argv):
        raise UserError(f"recipe file {path}: argv must contain {{port}} (k2bench picks the port)")
    return replace(recipe, source=str(path))


def all_recipes(folder: str | Path | None = None) -> dict[str, Recipe]:
    """Built-ins, then the user folder's *.toml in name order (a file may override a built-in)."""
    found = dict(RECIPES)
    where = recipes_dir(folder)
    if where is None:
        return found
    if not where.is_dir():
        raise UserError(f"recipe folder {where} does not exist")
    for path in sorted(where.glob("*.toml")):
        recipe = _from_toml(path, found)
        if recipe.name == CUSTOM:
            raise UserError(f"recipe file {path}: the name 'custom' is reserved for --server-cmd")
        found[recipe.name] = recipe
    return found


def get(name: str, folder: str | Path | None = None) -> Recipe:
    if name == CUSTOM:
        raise UserError("the custom recipe takes its command from --server-cmd 'CMD with {port}'")
    known = all_recipes(folder)
    try:
        return known[name]
    except KeyError:
        raise UserError(f"unknown engine recipe {name!r}; known: {', '.join(sorted(known))} "
                        f"(or --server-cmd)") from None


def _fill(parts: tuple[str, ...], values: dict[str, str]) -> list[str]:
    return [p.format(**values) for p in parts]


def render(recipe: Recipe, *, model: str, tp: int, port: int, host: str = "127.0.0.1",
           extra_args: str | list[str] | None = None) -> tuple[list[str], list[str]]:
    """The full command line and the flags to record (recipe flags + extra arguments)."""
    extra = shlex.split(extra_args) if isinstance(extra_args, str) else list(extra_args or [])
    values = {"python": sys.executable, "model": model, "tp": str(tp), "host": host, "port": str(port)}
    flags = list(recipe.flags) + extra
    recorded = (list(recipe.argv) if recipe.record_command else []) + flags  # the template: no port in it
    return _fill(recipe.argv, values) + flags, recorded


def version_command(recipe: Recipe) -> list[str] | None:
    if recipe.version_argv is None:
        return None
    return _fill(recipe.version_argv, {"python": sys.executable})
