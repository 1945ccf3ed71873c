"""Fleet dispatch through existing schedulers: a GitHub Actions matrix, or a Slurm job array.

k2bench does not schedule anything itself: each fleet task runs ``k2bench suite run FILE --only
id=JOB`` and writes to the shared database, so a task that is re-run skips a job already stored.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness.suites import Job, Suite

DEFAULT_LABEL = "gpu"  # runner label of a job that names no hardware


def github_matrix(jobs: list[Job], default_label: str = DEFAULT_LABEL) -> dict:
    """``strategy.matrix`` for GitHub Actions: one ``include`` entry per job.

    ``runner`` is the job's hardware label (for ``runs-on``); the other keys are there to read in
    the Actions UI."""
    include = []
    for job in jobs:
        entry = {"id": job.id, "runner": job.get("hardware") or default_label}
        for key in ("engine", "model", "tp", "workload"):
            if job.get(key) is not None:
                entry[key] = job.get(key)
        include.append(entry)
    return {"include": include}


@dataclass
class SlurmSubmission:
    job_id: str
    script: Path
    tasks: int
    exit_code: int | None  # with --wait: the highest exit code of the array's tasks


def slurm_script(suite: Suite, jobs: list[Job], *, workdir: Path, db: str | None, run_args: list[str],
                 partition: str | None, time_limit: str | None, gpus_per_task: int | None,
                 log_dir: Path) -> str:
    """A batch script for an array of one task per job; each task runs one job of the suite."""
    ids = " ".join(shlex.quote(j.id) for j in jobs)
    k2 = shlex.join([sys.executable, "-m", "k2bench.harness.cli"])
    run = ["suite", "run", str(suite.path.resolve()), *(["--db", db] if db else []), *run_args]
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=k2bench-{re.sub(r'[^A-Za-z0-9_.-]', '_', suite.name)}",
             f"#SBATCH --array=0-{len(jobs) - 1}",
             f"#SBATCH --chdir={workdir}",
             f"#SBATCH --output={log_dir}/%A_%a.out"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    if gpus_per_task:
        lines.append(f"#SBATCH --gpus-per-task={gpus_per_task}")
    lines += ["set -euo pipefail",
              f"JOBS=({ids})",
              'JOB=${JOBS[$SLURM_ARRAY_TASK_ID]}',
              'echo "k2bench suite job $JOB (array task $SLURM_ARRAY_TASK_ID)"',
              f'exec {k2} {shlex.join(run)} --only "id=$JOB"', ""]
    return "\n".join(lines)


def submit_slurm(suite: Suite, jobs: list[Job], *, db: str | None = None, run_args: list[str] | None = None,
                 partition: str | None = None, time_limit: str | None = None, gpus_per_task: int | None = None,
                 sbatch_args: list[str] | None = None, wait: bool = False,
                 out_dir: str | Path = "results/slurm") -> SlurmSubmission:
    """Write the array script under ``out_dir`` and hand it to ``sbatch`` (``--wait`` blocks until every
    task has ended, and sbatch then exits with the highest task exit code)."""
    if not jobs:
        raise UserError("no job to submit")
    if shutil.which("sbatch") is None:
        raise UserError("sbatch is not on PATH: run this on a Slurm login node (or install slurm-client)")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    folder = Path(out_dir).resolve() / f"{suite.name}-{stamp}"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "array.sbatch"
    script.write_text(slurm_script(suite, jobs, workdir=Path.cwd(), db=db, run_args=run_args or [],
                                   partition=partition, time_limit=time_limit, gpus_per_task=gpus_per_task,
                                   log_dir=folder))
    argv = ["sbatch", "--parsable", *(["--wait"] if wait else []), *(sbatch_args or []), str(script)]
    out = subprocess.run(argv, capture_output=True, text=True)
    first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    job_id = first.split(";")[0]
    if not job_id.isdigit():
        detail = (out.stderr or out.stdout).strip().splitlines()
        raise UserError(f"sbatch did not accept the array ({shlex.join(argv)}): "
                        f"{detail[-1] if detail else f'exit code {out.returncode}'}")
    return SlurmSubmission(job_id=job_id, script=script, tasks=len(jobs),
                           exit_code=out.returncode if wait else None)


def matrix_json(jobs: list[Job], default_label: str = DEFAULT_LABEL) -> str:
    return json.dumps(github_matrix(jobs, default_label), separators=(",", ":"))
