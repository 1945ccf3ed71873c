"""The README's quick start, run as written (aiperf's documented-commands pattern).

The commands are read from the fenced block that follows the `docs-test: quickstart` marker in
README.md, so the test follows the README rather than a copy of it. Two kinds of command are not
run, and the test fails on any command that is neither run nor listed here:
- environment set-up that CI has already done: `.ci/run` creates the venv, activates it and pip
  installs torch and every extra before the tests start (SET_UP_BY_CI);
- `k2bench dashboard`, a server that runs until Ctrl-C; tests/dashboard/test_dashboard_browser.py
  starts it and loads every page (LONG_RUNNING).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- docs-test: quickstart"
SET_UP_BY_CI = (("python3", "-m", "venv"), (".",), ("pip", "install"))
LONG_RUNNING = (("k2bench", "dashboard"),)


def quickstart_commands(readme: str) -> list[list[str]]:
    """Each command of the marked block as argv: continuations joined, `&&` chains split, comments dropped."""
    assert MARKER in readme, f"README.md lost its quick-start marker ({MARKER} ...)"
    after = readme.split(MARKER, 1)[1]
    block = re.search(r"```(?:bash|sh)\n(.*?)```", after, re.DOTALL)
    assert block, "no fenced bash block after the quick-start marker"
    script = block.group(1).replace("\\\n", " ")
    commands: list[list[str]] = []
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in [*words, "&&"]:
            if word == "&&":
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


def _starts_with(argv: list[str], prefixes: tuple[tuple[str, ...], ...]) -> bool:
    return any(tuple(argv[: len(p)]) == p for p in prefixes)


def test_the_parser_reads_chains_continuations_and_comments() -> None:
    readme = f"""intro\n{MARKER} -->\n```bash\n# a comment\na x && \\\n  b 'y z' && c   # trailing\n```\n"""
    assert quickstart_commands(readme) == [["a", "x"], ["b", "y z"], ["c"]]


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(1800)  # a busy 2-core machine has taken 5 minutes for this sweep; no wall-clock budget here
def test_readme_quickstart_runs_and_stores_every_level(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the quick start runs the bundled engine (engine extra)")
    commands = quickstart_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    to_run = [c for c in commands if not _starts_with(c, SET_UP_BY_CI + LONG_RUNNING)]
    unknown = [c for c in to_run if c[0] != "k2bench"]
    assert not unknown, f"quick-start commands this test does not know how to run: {unknown}"
    assert [c[1] for c in to_run][:2] == ["sweep", "runs"], to_run
    assert _starts_with(commands[-1], LONG_RUNNING), "the quick start should end by opening the dashboard"

    bindir = Path(sys.executable).parent
    assert (bindir / "k2bench").exists(), "the k2bench console script is not installed next to this python"
    db = f"sqlite:///{tmp_path / 'quickstart.db'}"
    # A scratch folder as the working directory: logs go to its results/ and the database to a temporary
    # file, so the checkout's own results are left alone; the trained tiny model comes from the tests'
    # shared model cache (K2BENCH_MODELS, set in tests/conftest.py), so the suite trains it at most once.
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "K2BENCH_DB": db}

    def run(argv: list[str]) -> str:
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    outputs = [run(argv) for argv in to_run]
    sweep = next(c for c in to_run if c[1] == "sweep")
    isl, osl = int(sweep[sweep.index("--isl") + 1]), int(sweep[sweep.index("--osl") + 1])

    # The first run in a fresh database has id 1; what was stored is read back through the CLI.
    exported = tmp_path / "run1.json"
    run(["k2bench", "export", "1", "--json", str(exported)])
    doc = json.loads(exported.read_text(encoding="utf-8"))
    assert doc["run"]["status"] == "complete"
    assert (doc["run"]["isl"], doc["run"]["osl"]) == (isl, osl)
    # the main job carries the trained model's accuracy on its task's 500 held-out items
    assert [(e["task"], e["n"]) for e in doc["evals"]] == [("tiny-arith", 500)]
    assert doc["evals"][0]["value"] >= 0.95, doc["evals"][0]
    levels = {p["concurrency"]: p for p in doc["points"]}
    assert sorted(levels) == [4, 8, 16]
    for conc, point in levels.items():
        assert point["completed"] == 10 * conc and point["failed"] == 0, point  # InferenceX: 10 x concurrency
        assert point["osl_mismatches"] == 0
        assert point["tput_per_gpu"] > 0 and point["interactivity"]["median"] > 0
    runs_out = outputs[[c[1] for c in to_run].index("runs")]
    assert "complete" in runs_out
    shown = run(["k2bench", "show", "1"])
    for conc in levels:
        assert re.search(rf"(?m)^\W*{conc}\b", shown), f"level {conc} missing from `k2bench show 1`:\n{shown}"
