"""Fleet dispatch through existing schedulers: a GitHub Actions matrix, or a Slurm job array.

k2bench does not schedule anything itself: each fleet task runs ``k2bench suite run FILE --only
id=JOB`` and writes to the shared database, so a task that is re-run skips a job already stored.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness import redact
from k2bench.harness.plan.suites import Job, Suite

DEFAULT_LABEL = "gpu"  # runner label of a job that names no hardware
DB_ENV = "K2BENCH_DB"  # how a database URL with a password reaches the tasks: the environment, not the script


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
    """A batch script for an array of one task per job; each task runs one job of the suite.

    A database URL that holds a secret is not written into the script: the tasks read it from
    K2BENCH_DB, which sbatch passes on from the submitting environment (see `submit_slurm`)."""
    ids = " ".join(shlex.quote(j.id) for j in jobs)
    k2 = shlex.join([sys.executable, "-m", "k2bench.harness.cli"])
    inline_db = db if db and not redact.values_in_text(db) else None
    run = ["suite", "run", str(suite.path.resolve()), *(["--db", inline_db] if inline_db else []), *run_args]
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
    lines.append("set -euo pipefail")
    if db and not inline_db:
        lines.append(f': "${{{DB_ENV}:?the database URL holds a password, so it comes from the environment that '
                     f'sbatch passes on: submit with --export=ALL or --export=...,{DB_ENV}}}"')
    lines += [f"JOBS=({ids})",
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
    env = dict(os.environ)
    if db and redact.values_in_text(db):
        exports = [a.split("=", 1)[1] for a in sbatch_args or [] if a.startswith("--export=")]
        if exports and not any(w in ("ALL", DB_ENV) or w.startswith(f"{DB_ENV}=") for w in exports[-1].split(",")):
            raise UserError(f"the database URL holds a password, so it reaches the tasks in {DB_ENV} and not in the "
                            f"script: add {DB_ENV} to --export (e.g. --sbatch-arg=--export={exports[-1]},{DB_ENV})")
        env[DB_ENV] = db
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    folder = Path(out_dir).resolve() / f"{suite.name}-{stamp}"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "array.sbatch"
    text = slurm_script(suite, jobs, workdir=Path.cwd(), db=db, run_args=run_args or [], partition=partition,
                        time_limit=time_limit, gpus_per_task=gpus_per_task, log_dir=folder)
    with os.fdopen(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:  # owner-only
        fh.write(text)
    argv = ["sbatch", "--parsable", *(["--wait"] if wait else []), *(sbatch_args or []), str(script)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    job_id = first.split(";")[0]
    if not job_id.isdigit():
        detail = (out.stderr or out.stdout).strip().splitlines()
        raise UserError(f"sbatch did not accept the array ({redact.text(shlex.join(argv))}): "
                        f"{detail[-1] if detail else f'exit code {out.returncode}'}")
    return SlurmSubmission(job_id=job_id, script=script, tasks=len(jobs),
                           exit_code=out.returncode if wait else None)


def matrix_json(jobs: list[Job], default_label: str = DEFAULT_LABEL) -> str:
    return json.dumps(github_matrix(jobs, default_label), separators=(",", ":"))
