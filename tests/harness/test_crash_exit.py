"""A crash (an exception nobody expected) exits 70 with one line and a saved traceback, never 1, which
CI scripts read as "a level was stored invalid"; ci/lib.sh's k2_sweep fails on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from k2bench.harness import crash
from k2bench.harness.cli import main
from k2bench.harness.commands import sweep_output
from k2bench.harness.store import Store

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SWEEP = ["--engine", "testserver", "--server-args", "--ttft-ms 1 --itl-ms 1", "--isl", "16", "--osl", "4",
         "--conc", "1", "--num-prompts", "2", "--warmup", "0", "--no-telemetry"]


def test_a_sweep_that_crashes_after_storing_its_run_exits_70(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # the server log goes to ./results/logs
    monkeypatch.setenv(crash.CRASH_DIR_ENV, str(tmp_path / "crashes"))

    def broken(*args, **kwargs):
        raise RuntimeError("[bold]report broke[/bold]\nsecond line")

    monkeypatch.setattr(sweep_output, "report", broken)
    db = f"sqlite:///{tmp_path}/k.db"
    code = main(["sweep", *SWEEP, "--db", db])
    err = capsys.readouterr().err
    assert code == crash.EXIT_CRASH == 70
    line = next(x for x in err.splitlines() if "internal error" in x)
    assert "RuntimeError: [bold]report broke[/bold]" in line and "second line" not in line
    saved = list((tmp_path / "crashes").glob("k2bench-crash-*.txt"))
    assert len(saved) == 1 and str(saved[0]) in line
    assert "Traceback" not in err  # the traceback is in the file, not on the console
    text = saved[0].read_text()
    assert "Traceback" in text and "in broken" in text and "second line" in text
    assert saved[0].stat().st_mode & 0o077 == 0  # exceptions may quote secrets: the owner's eyes only
    with Store.open(db, readonly=True) as store:
        (run,) = store.list_runs()
    assert run["status"] == "complete" and run["levels"] == 1  # the crash came after the run was stored


def test_user_errors_and_invalid_levels_keep_their_codes(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--conc", "0", "--db", f"sqlite:///{tmp_path}/k.db"]) == 2
    # a level whose usage disagrees with the asked length is stored invalid: exit 1, not the crash code
    code = main(["sweep", *SWEEP, "--server-args", "--ttft-ms 1 --itl-ms 1 --completion-tokens-delta 1",
                 "--db", f"sqlite:///{tmp_path}/k.db"])
    assert code == 1


def test_traceback_goes_to_stderr_when_it_cannot_be_saved(tmp_path, monkeypatch, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(crash.CRASH_DIR_ENV, str(blocker / "sub"))  # a folder inside a file: cannot exist
    try:
        raise ValueError("boom")
    except ValueError as exc:
        assert crash.report_crash(exc) == 70
    err = capsys.readouterr().err
    assert "ValueError: boom; traceback below" in err and "Traceback (most recent call last)" in err


def _k2_sweep(tmp_path: Path, sweep_cmd: str) -> subprocess.CompletedProcess:
    """ci/lib.sh's k2_sweep in bash, running `sweep_cmd` as the sweep in tmp_path."""
    script = (f'source {ROOT / "ci" / "lib.sh"}\nDB=sqlite:///{tmp_path}/k.db\n'
              f'k2_sweep pr "{tmp_path}" 0123456789abcdef main "$@"\necho "went on"\n')
    env = {**os.environ, "K2BENCH_SWEEP_CMD": sweep_cmd, crash.CRASH_DIR_ENV: str(tmp_path / "crashes")}
    return subprocess.run(["bash", "-c", script, "k2", *SWEEP], capture_output=True, text=True, env=env,
                          timeout=300)


def test_ci_k2_sweep_fails_on_a_crash(tmp_path) -> None:
    out = _k2_sweep(tmp_path, f"{sys.executable} {HERE / 'crashing_k2bench.py'} sweep")
    assert out.returncode == 3, out.stderr
    assert "failed (exit 70)" in out.stderr and "went on" not in out.stdout
    assert "internal error" in out.stderr and "report broke" in out.stderr


@pytest.mark.parametrize(("code", "goes_on"), [(1, True), (0, True), (2, False), (70, False)])
def test_ci_k2_sweep_goes_on_only_after_an_invalid_level(tmp_path, code, goes_on) -> None:
    out = _k2_sweep(tmp_path, f"bash -c 'exit {code}' sweep")
    assert (out.returncode, "went on" in out.stdout) == ((0, True) if goes_on else (3, False))


def test_docs_list_every_exit_code_of_sweep() -> None:
    from k2bench.harness.run.sweep import EXIT_CODES

    page = (ROOT / "docs" / "harness.md").read_text()
    documented = {int(line.split("|")[1]) for line in page.splitlines()
                  if line.startswith("| ") and line.split("|")[1].strip().isdigit()}
    assert documented == {code for code, _ in EXIT_CODES}
