"""A scratch git repository of small OpenAI-compatible servers: one commit's token gap differs."""

from __future__ import annotations

import subprocess
from pathlib import Path

SERVE = '''"""A small OpenAI-compatible server: k2bench's test server with this commit's token gap."""
import runpy
import sys

ITL_MS = {itl}
sys.argv = ["serve", *sys.argv[1:], "--ttft-ms", "5", "--itl-ms", str(ITL_MS)]
runpy.run_module("k2bench.harness.load.testserver", run_name="__main__")
'''
SERVER_CMD = "{python} serve.py --host {host} --port {port}"
SWEEP = ["--isl", "8", "--osl", "8", "--conc", "2", "--num-prompts", "10", "--warmup", "1", "--timeout", "60"]


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "k2", "GIT_AUTHOR_EMAIL": "k2@example.com", "GIT_COMMITTER_NAME": "k2",
           "GIT_COMMITTER_EMAIL": "k2@example.com", "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def make_repo(path: Path, n: int = 16, slow_from: int = 11, itl_ms: float = 20.0, factor: float = 1.3) -> list[str]:
    """Commits 1..n (shas returned oldest first); from commit ``slow_from`` on the gap is ``factor`` x."""
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    shas = []
    for i in range(1, n + 1):
        itl = itl_ms * factor if i >= slow_from else itl_ms
        (path / "serve.py").write_text(SERVE.format(itl=round(itl, 3)))
        (path / "CHANGES").write_text(f"change {i}\n")
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", f"c{i}: change {i}", "--date", f"2026-01-{i:02d}T12:00:00+00:00")
        shas.append(_git(path, "rev-parse", "HEAD"))
    return shas
