"""The reproducible record of a run, and the shell sequence that re-runs it (`k2bench show RUN --repro`).

Users of public benchmarks who cannot reproduce a published number ask first for the exact commands,
environment, versions, hardware and workload. A sweep records all of these with the run (in
``extra.repro``); values of environment variables and flags whose names look like secrets, and
passwords inside URLs, are replaced by ``***`` before anything is stored.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import asdict

from k2bench.harness import provenance
from k2bench.workloads.loader import Workload

MASK = "***"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^/:@\s]*:)[^@/\s]+@")
# the server's environment worth recording: what changes how an engine runs (not the whole environ)
SERVER_ENV_PREFIXES = ("CUDA_", "HIP_", "ROCR_", "ROCM_", "HSA_", "NCCL_", "RCCL_", "VLLM_", "SGLANG_", "ATOM_",
                       "AITER_", "TRITON_", "OMP_", "MKL_", "PYTORCH_", "TORCH_", "HF_", "K2BENCH_", "NVIDIA_")
SEED_RULE = "the prompts of a level use seed x 1000003 + concurrency x 1009 + trial (same seed, same prompts)"
_LEFT_OUT = ("--json",)  # re-running must not overwrite the original run's file


def mask_text(text: str) -> str:
    """A URL's password replaced by ***."""
    return _URL_PASSWORD.sub(rf"\1{MASK}@", text)


def mask_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if SECRET_NAME.search(k) else mask_text(v)) for k, v in env.items()}


def mask_argv(argv: list[str]) -> list[str]:
    """The value of every flag whose name looks like a secret (--api-key KEY, --hf-token=T) masked."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if any(c.isspace() for c in arg):  # a quoted group of server arguments (--server-args '--api-key k')
            try:
                out.append(shlex.join(mask_argv(shlex.split(arg))))
            except ValueError:  # not shell words: mask what can be masked
                out.append(mask_text(arg))
            continue
        name, eq, _ = arg.partition("=")
        if name.startswith("-") and SECRET_NAME.search(name):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(mask_text(arg))
    return out


def mask_command(command: str | None) -> str | None:
    """A recorded shell command line ('ENV=v prog --flag value') with its secrets masked."""
    if command is None:
        return None
    words = shlex.split(command)
    env_words = []
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        env_words.append(words.pop(0))
    env = mask_env(dict(w.split("=", 1) for w in env_words))
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(mask_argv(words))])


def server_env(recipe_env: dict[str, str]) -> dict[str, str]:
    """What a launched server's environment held that changes how it runs: the recipe's settings
    and this process's variables with a known engine prefix, secrets masked."""
    env = {k: v for k, v in os.environ.items() if k.startswith(SERVER_ENV_PREFIXES)}
    env.update(recipe_env)
    return mask_env(dict(sorted(env.items())))


def record(command_line: list[str] | None, server_command: str | None, env: dict[str, str] | None,
           base_url: str, workload: Workload) -> dict:
    """What ``extra.repro`` holds: enough to set the measurement up again."""
    return {
        "command": None if command_line is None else ["k2bench", *mask_argv(command_line)],
        "server_command": mask_command(server_command),
        "server_env": env,  # None: the server was attached, its environment is not ours to see
        "base_url": base_url,
        "versions": provenance.versions(),
        "gpus": provenance.gpus(),
        "workload": asdict(workload),
        "seeds": SEED_RULE,
    }


def script(run: dict, levels: int) -> str:
    """A copy-paste shell sequence that re-runs ``run`` (a stored run's fields)."""
    rep = (run.get("extra") or {}).get("repro")
    if not rep:
        return (f"# run {run['id']} has no reproducible record (it was stored before k2bench recorded one, "
                f"or imported without it)\n")
    lines = [f"# re-run the measurement of run {run['id']} ({run.get('status')}, {levels} level(s), started "
             f"{str(run.get('started_at'))[:16]} UTC)"]
    if run.get("commit"):
        where = f" on branch {run['branch']}" if run.get("branch") else ""
        dirty = "; the run's tree had uncommitted changes" if (run.get("extra") or {}).get("git_dirty") else ""
        lines.append(f"# code measured: commit {run['commit']}{where}{dirty} (git checkout {run['commit'][:12]})")
    versions = ", ".join(f"{k} {v}" for k, v in (rep.get("versions") or {}).items())
    lines.append(f"# versions: {versions}")
    gpus = "; ".join(g.get("name", "?") + (f" (max SM clock {g['max_sm_mhz']} MHz)" if g.get("max_sm_mhz") else "")
                     for g in rep.get("gpus") or []) or "none visible"
    lines.append(f"# hardware: {run.get('hardware')}; GPUs: {gpus}")
    w = rep.get("workload") or {}
    lines.append(f"# workload {w.get('name')}: ISL {w.get('isl')}, OSL {w.get('osl')}, range ratio "
                 f"{w.get('range_ratio')}, {w.get('mode')} prompts, seed {w.get('seed')}; {rep.get('seeds')}")
    env = rep.get("server_env")
    if rep.get("server_command"):
        lines.append(f"# the sweep launched the server itself: {rep['server_command']}")
    else:
        lines.append(f"# the server at {rep.get('base_url')} was started outside k2bench: start it the same way "
                     f"first (same engine, version, flags and environment)")
    for key, value in (env or {}).items():
        if value == MASK:
            lines.append(f"# export {key}=...   (a secret: set it yourself)")
        else:
            lines.append(f"export {key}={shlex.quote(value)}")
    command = rep.get("command")
    if command is None:
        lines.append("# the sweep was started from Python, not the command line: no command recorded")
    else:
        kept, skip = [], False
        for arg in command:
            if skip:
                skip = False
                continue
            if arg in _LEFT_OUT:
                skip = True
                continue
            if arg.split("=", 1)[0] in _LEFT_OUT:
                continue
            kept.append(arg)
        if len(kept) != len(command):
            lines.append("# (--json left out, so the original run's file is not overwritten)")
        if any(MASK in a for a in kept):
            lines.append(f"# {MASK} marks a secret that was not recorded: put it back before running")
        lines.append(shlex.join(kept))
    return "\n".join(lines) + "\n"
