"""Bisect: the first commit whose metric is worse than the good end, judged with the gate's statistics.

Each commit's evidence is every stored complete run of it with the bench's configuration (per-run
values, trial values and per-request samples at one concurrency); ``regress.decide`` (the PR gate's
rule: a threshold and significance) compares it with both ends. A commit is bad when it is a
regression against good and not an improvement against bad; good when it is an improvement against
bad and not a regression against good. Anything else is inconclusive: the commit is measured again
(more samples) up to ``max_remeasure`` times, never guessed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from k2bench.errors import UserError
from k2bench.harness.analysis import gate_metrics, regress
from k2bench.harness.history import gitrepo
from k2bench.harness.history.backfill import CommitBench

SCHEMA = "k2bench.bisect/1"


@dataclass
class Evidence:
    runs: list[int]
    per_run: np.ndarray
    trials: np.ndarray
    samples: np.ndarray

    @property
    def value(self) -> float:
        return float(np.median(self.per_run)) if len(self.per_run) else float("nan")


@dataclass
class Step:
    commit: gitrepo.Commit
    value: float
    verdict: str  # good | bad | inconclusive (ends: good | bad)
    runs: list[int] = field(default_factory=list)


@dataclass
class BisectResult:
    first_bad: gitrepo.Commit | None
    steps: list[Step]
    measured: int  # commits measured by this call (reused ones not counted)
    message: str
    last_good: gitrepo.Commit | None = None  # the first bad commit's parent on the bisected path
    profiles: dict | None = None  # both sides' profiles and their kernel-time diff (`attach_profiles`)
    profile_section: str | None = None  # the same as markdown

    def to_json(self) -> dict:
        doc = {"schema": SCHEMA, "first_bad": self.first_bad.sha if self.first_bad else None,
               "steps": [{"commit": s.commit.sha, "value": s.value if np.isfinite(s.value) else None,
                          "verdict": s.verdict} for s in self.steps]}
        if self.profiles:
            doc["profiles"] = self.profiles
        return doc


class Bisector:
    def __init__(self, bench: CommitBench, metric: str, concurrency: int,
                 config: regress.RegressConfig | None = None, max_remeasure: int = 2) -> None:
        chosen = gate_metrics.one(metric)  # any catalogue metric, gated by default or not (steady-state ones)
        if concurrency not in bench.cfg.levels:
            raise UserError(f"--conc {concurrency} is not among the sweep's levels")
        self.bench, self.metric = bench, chosen
        self.conc, self.max_remeasure = concurrency, max_remeasure
        self.config = config or regress.RegressConfig()
        self._evidence: dict[str, Evidence] = {}

    # ------------------------------------------------------------------ evidence
    def evidence(self, commit: gitrepo.Commit, *, more: bool = False) -> Evidence:
        """Stored runs of the commit, measuring it first when there is none (or when ``more``)."""
        from k2bench.harness.store import Store

        with Store.open(self.bench.cfg.db) as store:
            runs = self.bench.stored_runs(store, commit.sha)
        if not runs or more:
            self.bench.say(f"measuring {commit.short} {commit.subject[:60]}" + (" again" if runs else ""))
            run_id, status = self.bench.measure(commit)
            if status != "complete":
                with Store.open(self.bench.cfg.db, readonly=True) as store:
                    note = store.get_run(run_id).get("notes") or status
                raise UserError(f"commit {commit.short} could not be measured (run {run_id}): "
                                f"{note.splitlines()[0]}")
            with Store.open(self.bench.cfg.db) as store:
                runs = self.bench.stored_runs(store, commit.sha)
        ev = self._collect([r["id"] for r in runs])
        self._evidence[commit.sha] = ev
        return ev

    def _collect(self, run_ids: list[int]) -> Evidence:
        from k2bench.harness.store import Store

        col = self.metric.column
        with Store.open(self.bench.cfg.db, readonly=True) as store:
            points = store.points_frame(run_ids=run_ids)
            points = points[(points["concurrency"] == self.conc) & (points["mode"] == "closed")]  # bisect: --conc
            samples = [regress.request_samples(_closed(store.requests_frame(rid, self.conc)), self.conc,
                                               self.metric.sample) for rid in run_ids]
        per_run = regress.per_run(points, (col,))[col].dropna().to_numpy(float) if len(points) else np.zeros(0)
        if not len(per_run):
            raise UserError(f"runs {run_ids} have no {col} at concurrency {self.conc}")
        trials = points[col].dropna().to_numpy(float)
        pooled = np.concatenate([s for s in samples if s is not None]) if any(s is not None for s in samples) \
            else np.zeros(0)
        return Evidence(run_ids, per_run, trials, pooled)

    def compare(self, base: Evidence, cand: Evidence) -> regress.Verdict:
        # The gate's rule: one run's requests share its machine state, so they confirm a change only
        # beside a noise history of runs. Here the repeated runs of the reference end are that history
        # (same machine, same commit, measured back to back), once there are enough of them.
        history = base.per_run if len(base.per_run) >= self.config.min_history else None
        return regress.decide(self.metric, self.conc, base.per_run, cand.per_run, history, base.trials,
                              cand.trials, base.samples, cand.samples, self.config)

    # ------------------------------------------------------------------ search
    def _judge(self, commit: gitrepo.Commit, good: Evidence, bad: Evidence) -> tuple[str, Evidence]:
        ev = self._evidence.get(commit.sha) or self.evidence(commit)
        for attempt in range(self.max_remeasure + 1):
            vs_good, vs_bad = self.compare(good, ev).status, self.compare(bad, ev).status
            if vs_good == "regression" and vs_bad != "improvement":
                return "bad", ev
            if vs_bad == "improvement" and vs_good != "regression":
                return "good", ev
            if attempt < self.max_remeasure:
                self.bench.say(f"{commit.short}: inconclusive (against good: {vs_good}, against bad: {vs_bad}); "
                               "measuring it again")
                ev = self.evidence(commit, more=True)
        return "inconclusive", ev

    def run(self, good_rev: str, bad_rev: str) -> BisectResult:
        repo = self.bench.repo
        good, bad = gitrepo.resolve(repo, good_rev), gitrepo.resolve(repo, bad_rev)
        path = gitrepo.path_between(repo, good, bad)
        if len(path) < 2:
            raise UserError(f"--good {good.short} and --bad {bad.short} are the same commit")
        good_ev, bad_ev = self.evidence(good), self.evidence(bad)
        steps = [Step(good, good_ev.value, "good", good_ev.runs), Step(bad, bad_ev.value, "bad", bad_ev.runs)]
        for attempt in range(self.max_remeasure + 1):
            status = self.compare(good_ev, bad_ev).status
            if status in ("regression", "unchanged", "improvement") or attempt == self.max_remeasure:
                break
            self.bench.say(f"good against bad is {status}; measuring both ends again")
            good_ev, bad_ev = self.evidence(good, more=True), self.evidence(bad, more=True)
        steps[0].value, steps[1].value = good_ev.value, bad_ev.value
        if status != "regression":
            return BisectResult(None, steps, self._measured(), f"{bad.short} is not worse than {good.short} in "
                                f"{self.metric.column} at concurrency {self.conc} ({status}: "
                                f"{good_ev.value:.4g} -> {bad_ev.value:.4g}); nothing to bisect")
        lo, hi = 0, len(path) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            verdict, ev = self._judge(path[mid], good_ev, bad_ev)
            steps.append(Step(path[mid], ev.value, verdict, ev.runs))
            self.bench.say(f"{path[mid].short}: {self.metric.column} {ev.value:.4g} -> {verdict}")
            if verdict == "inconclusive":
                return BisectResult(None, steps, self._measured(),
                                    f"{path[mid].short} stays inconclusive after {self.max_remeasure} re-measurements "
                                    f"(the change may be gradual, or the noise too large); first bad commit is "
                                    f"between {path[lo].short} and {path[hi].short}")
            if verdict == "bad":
                hi = mid
            else:
                lo = mid
        first = path[hi]
        result = BisectResult(first, steps, self._measured(),
                              f"first bad commit: {first.sha} {first.subject} ({first.date})", last_good=path[lo])
        result.profile_section, result.profiles = self.profile_pair(path[lo], first)
        return result

    # ------------------------------------------------------------------ profiles at the culprit
    def profile_pair(self, last_good: gitrepo.Commit, first_bad: gitrepo.Commit) -> tuple[str | None, dict | None]:
        """Both commits' profiles and their kernel-time diff (markdown, JSON), or (None, None) when a side
        has none. With --profile-level, a side whose stored runs kept no profile (e.g. reused nightly
        runs) is measured once more, profiled."""
        from k2bench.harness.analysis.profile_diff import verdict_profiles
        from k2bench.harness.store import Store

        ids = {}
        for commit in (last_good, first_bad):
            with Store.open(self.bench.cfg.db, readonly=True) as store:
                runs = self.bench.stored_runs(store, commit.sha)
            if self.bench.cfg.profile_level and not any(r.get("profile") for r in runs):
                self.bench.say(f"profiling {commit.short} {commit.subject[:60]}")
                self.bench.measure(commit)
                with Store.open(self.bench.cfg.db, readonly=True) as store:
                    runs = self.bench.stored_runs(store, commit.sha)
            ids[commit.sha] = [r["id"] for r in runs]
        with Store.open(self.bench.cfg.db, readonly=True) as store:
            section, doc = verdict_profiles(store, ids[last_good.sha], ids[first_bad.sha], "last good", "first bad")
        if doc:
            doc["last good"]["commit"], doc["first bad"]["commit"] = last_good.sha, first_bad.sha
        return section, doc

    def _measured(self) -> int:
        return len(set(self.bench.measured))


def write_json(result: BisectResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result.to_json(), indent=2) + "\n")


def record(db: str | None, *, fingerprint: str | None, branch: str | None, metric: str, concurrency: int,
           good: str, bad: str, result: BisectResult | None) -> int:
    """Store the outcome for the dashboard; ``result`` None: good and bad are adjacent, bad is the culprit."""
    from k2bench.harness.store import Store

    if result is None:
        first, subject, steps = bad, None, []
    else:
        first = result.first_bad.sha if result.first_bad else None
        subject = result.first_bad.subject if result.first_bad else None
        steps = result.to_json()["steps"]
    with Store.open(db) as store:
        return store.add_culprit({"fingerprint": fingerprint, "branch": branch, "metric": metric,
                                  "concurrency": concurrency, "good": good, "bad": bad, "first_bad": first,
                                  "subject": subject, "steps": steps})


def _closed(requests):
    """The closed-loop levels' requests (a rate level may share a closed level's concurrency)."""
    return requests[requests["mode"] == "closed"]
