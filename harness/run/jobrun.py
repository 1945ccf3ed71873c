"""Running suite jobs on this machine: one sweep (one server) per job, sequentially, resumable.

A job already stored complete for the same commit with the same suite and job tags is skipped, so a
second call (or a re-queued Slurm task) only measures what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from k2bench.errors import UserError
from k2bench.harness.plan import settings
from k2bench.harness.plan.suites import Job, Suite
from k2bench.harness.record.provenance import git_commit
from k2bench.harness.run.config import SweepConfig
from k2bench.harness.run.sweep import LevelEvents, run_sweep

SUITE_TAG, JOB_TAG = "suite", "suite_job"


def job_config(suite: Suite, job: Job, base: SweepConfig | None = None) -> SweepConfig:
    """The SweepConfig of one job: its fields over ``base``, which carries what the command line adds
    (db, commit, tags, ...; default: the declared defaults)."""
    cfg = SweepConfig.from_settings(settings.from_table(job.fields, f"{suite.path} job {job.id}"), base)
    return replace(cfg, tags={**cfg.tags, SUITE_TAG: suite.name, JOB_TAG: job.id})


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
