"""Backfill: measure a repository's past commits, each from its own worktree, into the history.

For each commit: a detached git worktree, the optional set-up command run in it, the server command
started from it, one sweep stored with the commit's sha and branch. A commit already stored complete
with the same configuration fingerprint and server command is skipped; a commit whose set-up or
server fails is stored as a failed run whose notes give the reason, and the backfill goes on.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness import redact
from k2bench.harness.history import gitrepo
from k2bench.harness.record.fingerprint import fingerprint
from k2bench.harness.record.provenance import detect_hardware, precision_of
from k2bench.harness.run.sweep import LevelEvents, SweepConfig, SweepResult, run_sweep
from k2bench.harness.servers import launch, recipes

CMD_TAG = "server_cmd"


def sweep_with_command(cfg: SweepConfig, server_cmd: str, *, cwd: str | Path | None = None,
                       events: LevelEvents | None = None) -> SweepResult:
    """A sweep of a server started from ``server_cmd`` in ``cwd`` that the sweep attaches to.

    Attached, the run records engine "external" and no engine version: what a server reports as its
    version changes from commit to commit of its own repository, and the runs of one backfill must
    stay one series (one fingerprint). The command goes into the run's tags (``server_cmd``)."""
    recipe = recipes.custom(server_cmd)
    say = (events.message if events and events.message else None) or (lambda text: None)
    server = launch.from_recipe(recipe, model=cfg.model or "default", tp=cfg.tp, extra_args=cfg.server_args,
                                log_dir=cfg.log_dir, ready_timeout_s=cfg.ready_timeout_s, api_key=cfg.api_key,
                                cwd=cwd)
    say(f"starting: {server.shown_command}" + (f" (in {cwd})" if cwd else "") + f"  (log: {server.log_path})")
    with server:
        attached = replace(cfg, url=server.base_url, engine=None, server_cmd=None, server_args=None,
                           tags={**cfg.tags, CMD_TAG: redact.command(server_cmd)})
        return run_sweep(attached, events)


@dataclass
class CommitBench:
    """How to measure one commit of ``repo``; shared by backfill and bisect."""

    repo: Path
    server_cmd: str
    cfg: SweepConfig
    setup: str | None = None
    say: Callable[[str], None] = print
    measured: list[str] = field(default_factory=list)  # shas measured (not reused) by this object

    def __post_init__(self) -> None:
        # what the sweep would otherwise detect per run is fixed here, so the fingerprint is known
        # before measuring (and reruns can skip)
        self.cfg = replace(self.cfg, hardware=self.cfg.hardware or detect_hardware(),
                           model=self.cfg.model or "default")
        self.cfg.validate()

    def expected_meta(self) -> dict:
        """The fingerprinted fields of the runs this bench stores (an attached sweep records them so)."""
        c, w = self.cfg, self.cfg.workload
        # a model folder is recorded by its name and its precision, as the sweep records them
        # (run.sweep._describe_run)
        folder = Path(c.model) if c.model and Path(c.model).is_dir() else None
        return {"engine": "external", "engine_version": None, "engine_flags": None,
                "model": folder.name if folder else c.model,
                "precision": c.precision or (precision_of(folder) if folder else None), "hardware": c.hardware, "num_gpus": c.gpus or c.tp, "tp": c.tp,
                "workload": w.name, "isl": w.isl, "osl": w.osl, "range_ratio": w.range_ratio}

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.expected_meta())

    def stored_runs(self, store, sha: str) -> list[dict]:
        """Complete runs of this commit with this configuration and server command, oldest first."""
        runs = store.list_runs(commit=sha, fingerprint=self.fingerprint, status="complete")
        return sorted((r for r in runs if r.get("commit") == sha
                       and (r.get("tags") or {}).get(CMD_TAG) == redact.command(self.server_cmd)), key=lambda r: r["id"])

    def measure(self, commit: gitrepo.Commit, *, trials: int | None = None) -> tuple[int, str]:
        """Sweep ``commit`` from its worktree; returns (run id, status). Failures are stored, not raised."""
        from k2bench.harness.store import Store

        self.measured.append(commit.sha)
        branch = self.cfg.branch or gitrepo.branch_of(self.repo, commit.sha)
        cfg = replace(self.cfg, commit=commit.sha, branch=branch, trials=trials or self.cfg.trials)
        with Store.open(cfg.db) as store:
            before = max((r["id"] for r in store.list_runs(commit=commit.sha)), default=0)
        with gitrepo.worktree(self.repo, commit.sha) as tree:
            reason = self._setup(tree, commit)
            if reason is None:
                try:
                    result = sweep_with_command(cfg, self.server_cmd, cwd=tree)
                    return result.run_id, result.status
                except UserError as exc:
                    reason = str(exc)
        with Store.open(cfg.db) as store:
            started = [r for r in store.list_runs(commit=commit.sha) if r["id"] > before]
            if started:  # the sweep stored the run (failed or partial) before it gave up
                return started[0]["id"], started[0]["status"]
            return self._store_failed(store, cfg, reason), "failed"

    def _setup(self, tree: Path, commit: gitrepo.Commit) -> str | None:
        if not self.setup:
            return None
        log = Path(self.cfg.log_dir) / f"setup-{commit.short}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.say(f"{commit.short}: set-up: {self.setup}  (log: {log})")
        with open(log, "wb") as out:
            code = subprocess.run(["bash", "-c", self.setup], cwd=tree, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL).returncode
        if code == 0:
            return None
        return f"set-up command failed with exit code {code}; last lines of {log}:\n{launch.log_tail(log)}"

    def _store_failed(self, store, cfg: SweepConfig, reason: str) -> int:
        now = datetime.now(timezone.utc).isoformat()
        meta = {**self.expected_meta(), "commit": cfg.commit, "branch": cfg.branch, "status": "failed",
                "started_at": now, "tags": {**cfg.tags, CMD_TAG: self.server_cmd}, "notes": reason,
                "trials": cfg.trials}
        run_id = store.create_run(meta)
        store.finish_run(run_id, "failed")
        return run_id


@dataclass
class BackfillLine:
    commit: gitrepo.Commit
    status: str  # complete | partial | failed | skipped
    run_id: int


def backfill(bench: CommitBench, commits: list[gitrepo.Commit]) -> list[BackfillLine]:
    from k2bench.harness.store import Store

    lines = []
    for i, commit in enumerate(commits, 1):
        with Store.open(bench.cfg.db) as store:
            stored = bench.stored_runs(store, commit.sha)
        head = f"[{i}/{len(commits)}] {commit.short} {commit.subject[:60]}"
        if stored:
            bench.say(f"{head}: already stored as run {stored[0]['id']}; skipped")
            lines.append(BackfillLine(commit, "skipped", stored[0]["id"]))
            continue
        bench.say(head)
        run_id, status = bench.measure(commit)
        if status != "complete":
            with Store.open(bench.cfg.db, readonly=True) as store:
                note = store.get_run(run_id).get("notes") or ""
            bench.say(f"{head}: {status} (run {run_id})" + (f": {note.splitlines()[0]}" if note else ""))
        lines.append(BackfillLine(commit, status, run_id))
    return lines
