"""Running a kernel test's cases twice: in a child process under TRITON_INTERPRET=1 (the CPU check; the
interpreter must be on before triton compiles anything, hence the child) and in this process on CUDA
(the same cases, compiled kernels). Test modules in this folder import it by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run_interpreted(child: str, timeout: int = 560) -> dict:
    """Run `child` (Python source printing one line "RESULT<json>") under TRITON_INTERPRET=1 in a fresh
    process; return the JSON."""
    here = os.path.dirname(os.path.abspath(__file__))  # the child may import this folder's modules
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def interpreted_cases(cases: str, call: str, timeout: int = 280):
    """`call` (an expression over the names `cases` defines, e.g. "compare('cpu')") evaluated in an
    interpreted child; its JSON-able result."""
    return run_interpreted(cases + f"\nimport json\nprint('RESULT' + json.dumps({call}))\n", timeout=timeout)


def cuda_cases(cases: str, entry: str, *args, **kwargs):
    """`entry("cuda", *args, **kwargs)` from the names `cases` defines, run here on the GPU (skips without one)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    scope: dict = {}
    exec(cases, scope)  # noqa: S102 - the interpreter test's own cases, on compiled kernels
    return scope[entry]("cuda", *args, **kwargs)
