"""Running suite jobs on this machine: one sweep (one server) per job, sequentially, resumable.

A job already stored complete for the same commit with the same suite and job tags is skipped, so a
second call (or a re-queued Slurm task) only measures what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from k2bench.errors import UserError
from k2bench.harness.commands.sweep import parse_concurrency, parse_count
from k2bench.harness.provenance import git_commit
from k2bench.harness.suites import Job, Suite
from k2bench.harness.sweep import LevelEvents, SweepConfig, run_sweep
from k2bench.workloads import loader as workloads

SUITE_TAG, JOB_TAG = "suite", "suite_job"


def job_config(suite: Suite, job: Job, base: SweepConfig | None = None) -> SweepConfig:
    """The SweepConfig of one job; ``base`` carries what the command line adds (db, commit, tags...)."""
    f = job.fields
    conc = f.get("conc", "4..128")
    levels = parse_concurrency(",".join(map(str, conc)) if isinstance(conc, list) else str(conc))
    num_prompts, num_prompts_x = parse_count(None if f.get("num_prompts") is None else str(f["num_prompts"]),
                                             "num_prompts")
    warmup, warmup_x = parse_count(None if f.get("warmup") is None else str(f["warmup"]), "warmup")
    cfg = base or SweepConfig(levels=levels, workload=workloads.load("8k1k"))
    return replace(
        cfg, levels=levels, workload=workloads.resolve(f.get("workload"), f.get("isl"), f.get("osl")),
        engine=f.get("engine"), server_cmd=f.get("server_cmd"), model=f.get("model"), tp=int(f.get("tp", 1)), gpus=f.get("gpus"),
        hardware=f.get("hardware") or cfg.hardware, server_args=f.get("server_args"),
        precision=f.get("precision"), trials=int(f.get("trials", 1)), num_prompts=num_prompts,
        num_prompts_x=num_prompts_x, warmup=warmup, warmup_x=warmup_x,
        ready_timeout_s=f.get("ready_timeout"), timeout_s=float(f.get("timeout", cfg.timeout_s)),
        tags={**cfg.tags, SUITE_TAG: suite.name, JOB_TAG: job.id},
        # an entry's price and GPUs win over the command line's, like its hardware
        telemetry=replace(cfg.telemetry, gpu_hour_usd=f.get("gpu_hour_usd", cfg.telemetry.gpu_hour_usd),
                          gpu_ids=f.get("gpu_ids", cfg.telemetry.gpu_ids)),
    )


def stored_job_runs(store, commit: str | None, suite: str) -> dict[str, int]:
    """job id -> id of a complete run of it at this commit (nothing is known without a commit)."""
    if not commit:
        return {}
    found: dict[str, int] = {}
    for run in store.list_runs(commit=commit, status="complete"):
        tags = run.get("tags") or {}
        if run.get("commit") == commit and tags.get(SUITE_TAG) == suite and tags.get(JOB_TAG):
            found.setdefault(tags[JOB_TAG], run["id"])
    return found


@dataclass
class JobOutcome:
    job: Job
    status: str  # complete | partial | failed | skipped
    run_id: int | None
    message: str = ""


def run_suite(suite: Suite, jobs: list[Job], base: SweepConfig, *, say: Callable[[str], None] = print,
              events: LevelEvents | None = None) -> list[JobOutcome]:
    """Run each job not yet stored for this commit; a failed job is reported and the next one runs."""
    from k2bench.harness.store import Store

    commit = base.commit or git_commit()
    base = replace(base, commit=commit)
    with Store.open(base.db) as store:
        done = stored_job_runs(store, commit, suite.name)
    outcomes = []
    for i, job in enumerate(jobs, 1):
        if job.id in done:
            say(f"[{i}/{len(jobs)}] {job.id}: already stored as run {done[job.id]} for this commit; skipped")
            outcomes.append(JobOutcome(job, "skipped", done[job.id]))
            continue
        say(f"[{i}/{len(jobs)}] {job.id}")
        try:
            result = run_sweep(job_config(suite, job, base), events)
        except UserError as exc:
            say(f"[{i}/{len(jobs)}] {job.id} failed: {exc}")
            outcomes.append(JobOutcome(job, "failed", None, str(exc)))
            continue
        outcomes.append(JobOutcome(job, result.status, result.run_id))
    return outcomes
