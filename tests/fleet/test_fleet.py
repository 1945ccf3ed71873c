"""Fleet dispatch: the Slurm array script, and a real submission where a Slurm cluster runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from k2bench.errors import UserError
from k2bench.harness.cli import main
from k2bench.harness.plan import suites
from k2bench.harness.run import fleet
from k2bench.harness.store import Store

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "suites" / "cpu-smoke.toml"


def test_array_script_runs_one_job_per_task(tmp_path) -> None:
    suite = suites.load(SMOKE)
    text = fleet.slurm_script(suite, suite.jobs, workdir=tmp_path, db="sqlite:////shared/k.db", run_args=[],
                              partition="gpu", time_limit="01:00:00", gpus_per_task=4, log_dir=tmp_path)
    lines = text.splitlines()
    assert "#SBATCH --array=0-2" in lines and "#SBATCH --partition=gpu" in lines
    assert "#SBATCH --gpus-per-task=4" in lines and f"#SBATCH --chdir={tmp_path}" in lines
    assert f"JOBS=({' '.join(j.id for j in suite.jobs)})" in lines
    last = lines[-1]
    assert "suite run" in last and str(SMOKE) in last and "--db sqlite:////shared/k.db" in last
    assert last.endswith('--only "id=$JOB"')
    # the script is valid bash, and task i picks job i
    script = tmp_path / "a.sh"
    script.write_text(text.replace("exec ", "echo "))
    out = subprocess.run(["bash", str(script)], env={**os.environ, "SLURM_ARRAY_TASK_ID": "1"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith(f"--only id={suite.jobs[1].id}")


def test_submit_without_sbatch_says_so(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["suite", "submit", str(SMOKE), "--slurm", "--out", str(tmp_path)]) == 2
    assert "sbatch is not on PATH" in capsys.readouterr().err
    with pytest.raises(UserError, match="no job"):
        fleet.submit_slurm(suites.load(SMOKE), [])


def _fake_sbatch(folder: Path) -> Path:
    """An sbatch stand-in on PATH: records the script's mode, its text and the K2BENCH_DB it was handed."""
    fake = folder / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text('#!/bin/bash\nscript="${@: -1}"\nstat -c %a "$script" > "$(dirname "$0")/mode"\n'
                    'cp "$script" "$(dirname "$0")/script"\nprintf %s "${K2BENCH_DB:-}" > "$(dirname "$0")/db"\n'
                    'echo 4242\n')
    fake.chmod(0o755)
    return fake.parent


def test_a_database_password_reaches_the_tasks_through_the_environment_not_the_script(tmp_path, monkeypatch,
                                                                                       capsys) -> None:
    bin_dir = _fake_sbatch(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    db = "postgresql+psycopg2://bench:Sb4tchPw@db.example:5432/k2"
    assert main(["suite", "submit", str(SMOKE), "--slurm", "--db", db, "--out", str(tmp_path / "out")]) == 0
    assert "submitted Slurm array 4242" in capsys.readouterr().out
    script = (bin_dir / "script").read_text()
    assert (bin_dir / "mode").read_text().strip() == "600" and (bin_dir / "db").read_text() == db
    assert "Sb4tchPw" not in script and "--db" not in script and ': "${K2BENCH_DB:?' in script
    (written,) = (tmp_path / "out").glob("*/array.sbatch")
    assert written.stat().st_mode & 0o077 == 0
    # a task started without the variable stops at once, saying why
    out = subprocess.run(["bash", "-c", script.replace("exec ", "echo ")], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "SLURM_ARRAY_TASK_ID": "0"})
    assert out.returncode != 0 and "K2BENCH_DB" in out.stderr and "--export" in out.stderr
    # an --export list that would leave the variable behind is refused before anything is submitted
    code = main(["suite", "submit", str(SMOKE), "--slurm", "--db", db, "--sbatch-arg=--export=NONE",
                 "--out", str(tmp_path / "out2")])
    assert code == 2 and "--export=NONE,K2BENCH_DB" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()
    # a URL without a password stays in the script, where it documents the run
    assert main(["suite", "submit", str(SMOKE), "--slurm", "--db", "sqlite:////shared/k.db",
                 "--out", str(tmp_path / "out3")]) == 0
    assert "--db sqlite:////shared/k.db" in (bin_dir / "script").read_text()


def _slurm_reason() -> str | None:
    """Why no Slurm cluster can take jobs here (None when one can)."""
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return "sbatch/sinfo are not installed"
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if out.returncode != 0:
        return (out.stderr.strip().splitlines() or ["sinfo failed"])[-1]
    if not any(s in out.stdout for s in ("idle", "mixed", "allocated")):
        return f"no node is up (sinfo: {out.stdout.strip() or 'nothing'})"
    return None


@pytest.mark.slurm
@pytest.mark.slow
def test_submit_cpu_smoke_to_slurm_and_wait(tmp_path, capsys) -> None:
    reason = _slurm_reason()
    if reason:
        pytest.skip(f"Slurm is not running here ({reason}); `eval \"$(bash ci/start_slurm.sh)\"` starts one")
    db = f"sqlite:///{tmp_path / 'k.db'}"
    assert main(["suite", "submit", str(SMOKE), "--slurm", "--wait", "--db", db, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "3 task(s)" in out and "every task succeeded" in out
    with Store.open(db, readonly=True) as store:
        runs = store.list_runs()
    assert sorted(r["tags"]["suite_job"] for r in runs) == sorted(j.id for j in suites.load(SMOKE).jobs)
    assert {r["status"] for r in runs} == {"complete"}
