"""Fleet dispatch: the Slurm array script, and a real submission where a Slurm cluster runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from k2bench.errors import UserError
from k2bench.harness import fleet, suites
from k2bench.harness.cli import main
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
