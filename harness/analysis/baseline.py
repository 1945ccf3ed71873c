"""Which runs may a candidate be compared with, and which ones are its baseline?

Comparable means the same configuration fingerprint (engine, version, flags, model, precision,
hardware, GPUs/TP, workload, ISL/OSL, range ratio). Unlike runs are never compared; when no baseline
is found the reason says which fields differ from the nearest run that was considered.

Baseline modes:
* ``merge-base``: runs at ``git merge-base <default branch> <candidate commit>`` (the PR case);
* ``latest``: the latest ``baseline_runs`` default-branch runs started before the candidate;
* ``auto`` (default): merge-base when the candidate is off the default branch and runs exist there,
  else latest.
The noise history is always the recent default-branch runs of the same fingerprint (plus the
baseline runs), at most ``history_limit`` of them, none newer than the newest baseline run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from k2bench.errors import UserError
from k2bench.harness.record.fingerprint import fingerprint_fields
from k2bench.harness.record.provenance import git

USABLE_STATUS = ("complete", "partial")
MODES = ("auto", "merge-base", "latest")


@dataclass
class BaselineOptions:
    mode: str = "auto"
    default_branch: str = "main"
    repo: str | None = None  # git work tree for merge-base; None = current directory
    baseline_runs: int = 5  # latest mode: how many default-branch runs form the baseline
    history_limit: int = 10  # noise history size

    def validate(self) -> None:
        if self.mode not in MODES:
            raise UserError(f"unknown baseline mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.baseline_runs < 1 or self.history_limit < 1:
            raise UserError("--baseline-runs and --history must be at least 1")


@dataclass
class Selection:
    candidate: list[dict]
    baseline: list[dict] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    reason: str = ""  # why these runs (or why none)


def differing_fields(a: dict, b: dict) -> list[str]:
    """'field (a vs b)' for each fingerprint field where two runs differ."""
    fa, fb = fingerprint_fields(a), fingerprint_fields(b)
    return [f"{k} ({fa.get(k)!r} vs {fb.get(k)!r})" for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def comparable(a: dict, b: dict) -> tuple[bool, str]:
    """Whether two runs may be compared, and in words why not."""
    if a.get("fingerprint") and a.get("fingerprint") == b.get("fingerprint"):
        return True, ""
    diff = differing_fields(a, b)
    if not diff:  # fingerprints differ only through fields the hash covers but meta lacks
        diff = [f"fingerprint ({a.get('fingerprint')!r} vs {b.get('fingerprint')!r})"]
    return False, f"run {a.get('id')} and run {b.get('id')} are not comparable: they differ in " + ", ".join(diff)


def merge_base(repo: str | None, default_branch: str, commit: str) -> str | None:
    for ref in (default_branch, f"origin/{default_branch}"):
        mb = git(repo, "merge-base", ref, commit)
        if mb:
            return mb
    return None


def resolve_runs(store, spec: str, repo: str | None = None) -> list[dict]:
    """RUN id, or a commit (full or abbreviated SHA, or a git revision in ``repo``) -> its usable runs.

    For a commit with runs of several configurations, the configuration of its newest run is used.
    """
    spec = str(spec).strip()
    if spec.isdigit() and len(spec) < 7:
        return [store.get_run(int(spec))]
    hits = []
    if re.fullmatch(r"[0-9a-fA-F]{4,64}", spec):
        hits = [r for r in store.list_runs(commit=spec.lower()) if usable(r)]
    if not hits:
        sha = git(repo, "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
        if sha:
            hits = [r for r in store.list_runs(commit=sha) if usable(r)]
    if not hits:
        raise UserError(f"no usable run for {spec!r}: give a run id or a commit that has complete runs "
                        "(see `k2bench runs`)")
    return _same_config_as_newest(hits)


def usable(run: dict) -> bool:
    """Complete or partial (finished levels are comparable); never running or failed."""
    return (run.get("effective_status") or run.get("status")) in USABLE_STATUS


def _same_config_as_newest(runs: list[dict]) -> list[dict]:
    runs = sorted(runs, key=_start)
    fp = runs[-1].get("fingerprint")
    return [r for r in runs if r.get("fingerprint") == fp]


def _start(run: dict) -> str:
    return str(run.get("started_at") or "")


def select(store, candidate: list[dict], spec: str = "auto", opts: BaselineOptions | None = None) -> Selection:
    """Choose baseline and history runs for ``candidate`` (runs of one commit and fingerprint)."""
    opts = opts or BaselineOptions()
    opts.validate()
    cand_ids = {r["id"] for r in candidate}
    head = max(candidate, key=_start)
    fp = head.get("fingerprint")
    sel = Selection(candidate=candidate)
    same_fp = [r for r in store.list_runs(fingerprint=fp) if usable(r) and r["id"] not in cand_ids]
    if spec != "auto":
        base = resolve_runs(store, spec, opts.repo)
        ok, why = comparable(head, base[-1])
        if not ok:
            raise UserError(f"baseline refused: {why}")
        sel.baseline, sel.reason = base, f"baseline given: {spec} ({_ids(base)})"
    else:
        sel.baseline, sel.reason = _auto(store, head, same_fp, opts)
    if sel.baseline:
        newest = max(_start(r) for r in sel.baseline)
        main_runs = [r for r in same_fp if r.get("branch") == opts.default_branch and _start(r) <= newest]
        pool = {r["id"]: r for r in main_runs}
        pool.update({r["id"]: r for r in sel.baseline})
        sel.history = sorted(pool.values(), key=_start)[-opts.history_limit:]
    return sel


def _auto(store, head: dict, same_fp: list[dict], opts: BaselineOptions) -> tuple[list[dict], str]:
    commit = head.get("commit")
    notes = []
    if opts.mode in ("auto", "merge-base") and commit:
        mb = merge_base(opts.repo, opts.default_branch, commit)
        if mb is None:
            notes.append(f"no merge-base of {opts.default_branch} and {commit[:10]} in the git repo "
                         f"{opts.repo or '.'}")
        elif mb != commit:
            at_mb = [r for r in same_fp if r.get("commit") == mb]
            if at_mb:
                return at_mb, f"merge-base {mb[:10]} of {opts.default_branch}: run(s) {_ids(at_mb)}"
            others = [r for r in store.list_runs(commit=mb) if usable(r)]
            if others:
                notes.append(f"merge-base {mb[:10]} has no comparable run; "
                             + comparable(head, max(others, key=_start))[1])
            else:
                notes.append(f"merge-base {mb[:10]} has no runs")
        else:
            notes.append(f"{commit[:10]} is on {opts.default_branch}; using its history")
        if opts.mode == "merge-base":
            return [], "; ".join(notes) or "no merge-base baseline"
    # the commit's own earlier runs count too: repeated runs of one commit measure run-to-run noise
    earlier = [r for r in same_fp if (r.get("branch") == opts.default_branch or (commit and r.get("commit") == commit))
               and _start(r) < _start(head)]
    if earlier:
        base = sorted(earlier, key=_start)[-opts.baseline_runs:]
        which = opts.default_branch if all(r.get("branch") == opts.default_branch for r in base) else \
            f"{opts.default_branch} or same-commit"
        notes.append(f"latest {len(base)} {which} run(s) of the same configuration: {_ids(base)}")
        return base, "; ".join(notes)
    main_any = [r for r in store.list_runs(branch=opts.default_branch) if usable(r) and r["id"] != head["id"]]
    if main_any:
        notes.append(f"no earlier {opts.default_branch} run has the same configuration; nearest: "
                     + comparable(head, max(main_any, key=_start))[1])
    else:
        notes.append(f"no usable runs on {opts.default_branch}")
    return [], "; ".join(notes)


def _ids(runs: list[dict]) -> str:
    return ", ".join(f"#{r['id']}" for r in runs)
