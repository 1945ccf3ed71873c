"""The reproducible record of a run, and the shell sequence that re-runs it (`k2bench show RUN --repro`).

Users of public benchmarks who cannot reproduce a published number ask first for the exact commands,
environment, versions, hardware and workload. A sweep records all of these with the run (in
``extra.repro``); values of environment variables and flags whose names look like secrets, and
passwords inside URLs, are replaced by ``***`` before anything is stored.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict

from k2bench.harness import redact
from k2bench.harness.record import provenance
from k2bench.harness.redact import MASK
from k2bench.workloads.loader import Workload

# the server's environment worth recording: what changes how an engine runs (not the whole environ)
SERVER_ENV_PREFIXES = ("CUDA_", "HIP_", "ROCR_", "ROCM_", "HSA_", "NCCL_", "RCCL_", "VLLM_", "SGLANG_", "ATOM_",
                       "AITER_", "TRITON_", "OMP_", "MKL_", "PYTORCH_", "TORCH_", "HF_", "K2BENCH_", "NVIDIA_")
SEED_RULE = "the prompts of a level use seed x 1000003 + concurrency x 1009 + trial (same seed, same prompts)"
_LEFT_OUT = ("--json",)  # re-running must not overwrite the original run's file


def server_env(recipe_env: dict[str, str]) -> dict[str, str]:
    """What a launched server's environment held that changes how it runs: the recipe's settings
    and this process's variables with a known engine prefix, secrets masked."""
    env = {k: v for k, v in os.environ.items() if k.startswith(SERVER_ENV_PREFIXES)}
    env.update(recipe_env)
    return redact.env(dict(sorted(env.items())))


def record(command_line: list[str] | None, server_command: str | None, env: dict[str, str] | None,
           base_url: str, workload: Workload) -> dict:
    """What ``extra.repro`` holds: enough to set the measurement up again."""
    return {
        "command": None if command_line is None else ["k2bench", *redact.argv(command_line)],
        "server_command": redact.command(server_command),
        "server_env": env,  # None: the server was attached, its environment is not ours to see
        "base_url": redact.text(base_url),
        "versions": provenance.versions(),
        "gpus": provenance.gpus(),
        "workload": asdict(workload),
        "seeds": SEED_RULE,
    }


def _c(value: object) -> str:
    """A stored value made safe inside a shell comment: one line, control characters escaped (a stored
    newline would otherwise start a line that bash executes)."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in redact.text(str(value)))


def _command(command: list) -> list[str]:
    """The recorded k2bench words, without --json; the first word is always k2bench, whatever was stored."""
    kept, skip = [], False
    for arg in map(str, command[1:]):
        if skip:
            skip = False
            continue
        if arg in _LEFT_OUT:
            skip = True
            continue
        if arg.split("=", 1)[0] in _LEFT_OUT:
            continue
        kept.append(arg)
    return ["k2bench", *kept]


def script(run: dict, levels: int) -> str:
    """A copy-paste shell sequence that re-runs ``run`` (a stored run's fields).

    Stored text only ever lands in a comment (escaped to one line) or as a quoted word, so piping the
    output to bash runs the recorded k2bench command and nothing a stored string spells out."""
    rep = (run.get("extra") or {}).get("repro")
    if not rep or not isinstance(rep, dict):
        return (f"# run {_c(run['id'])} has no reproducible record (it was stored before k2bench recorded one, "
                f"or imported without it)\n")
    # masked again on the way out: a record stored by an older k2bench, or imported, may hold secrets
    rep = {**redact.deep(rep), "server_env": redact.env({str(k): str(v) for k, v in (rep.get("server_env") or {}).items()}),
           "command": redact.argv([str(a) for a in rep["command"]]) if rep.get("command") else None,
           "server_command": redact.command(str(rep["server_command"])) if rep.get("server_command") else None}
    lines = [f"# re-run the measurement of run {_c(run['id'])} ({_c(run.get('status'))}, {levels} level(s), "
             f"started {_c(str(run.get('started_at'))[:16])} UTC)"]
    if run.get("commit"):
        commit = _c(run["commit"])
        where = f" on branch {_c(run['branch'])}" if run.get("branch") else ""
        dirty = "; the run's tree had uncommitted changes" if (run.get("extra") or {}).get("git_dirty") else ""
        lines.append(f"# code measured: commit {commit}{where}{dirty} (git checkout {commit[:12]})")
    versions = ", ".join(f"{k} {v}" for k, v in (rep.get("versions") or {}).items())
    lines.append(f"# versions: {_c(versions)}")
    gpus = "; ".join(str(g.get("name", "?")) + (f" (max SM clock {g['max_sm_mhz']} MHz)" if g.get("max_sm_mhz") else "")
                     for g in rep.get("gpus") or []) or "none visible"
    lines.append(_c(f"# hardware: {run.get('hardware')}; GPUs: {gpus}"))
    w = rep.get("workload") or {}
    lines.append(_c(f"# workload {w.get('name')}: ISL {w.get('isl')}, OSL {w.get('osl')}, range ratio "
                    f"{w.get('range_ratio')}, {w.get('mode')} prompts, seed {w.get('seed')}; {rep.get('seeds')}"))
    if rep.get("server_command"):
        lines.append(_c(f"# the sweep launched the server itself: {rep['server_command']}"))
    else:
        lines.append(_c(f"# the server at {rep.get('base_url')} was started outside k2bench: start it the same way "
                        f"first (same engine, version, flags and environment)"))
    for key, value in (rep.get("server_env") or {}).items():
        if not redact.is_shell_name(key):
            lines.append(f"# (an environment entry whose name is not a shell variable name, left out: {_c(key)})")
        elif value == MASK:
            lines.append(f"# export {key}=...   (a secret: set it yourself)")
        elif MASK in str(value):
            lines.append(f"# export {key}={_c(value)}   (put the masked secret back and set it yourself)")
        else:
            lines.append(f"export {key}={shlex.quote(str(value))}")
    command = rep.get("command")
    if not command:
        lines.append("# the sweep was started from Python, not the command line: no command recorded")
    else:
        kept = _command(command)
        if len(kept) != len(command):
            lines.append("# (--json left out, so the original run's file is not overwritten)")
        if any(MASK in a for a in kept):
            lines.append(f"# {MASK} marks a secret that was not recorded: put it back before running")
        lines.append(shlex.join(kept))
    return "\n".join(lines) + "\n"
