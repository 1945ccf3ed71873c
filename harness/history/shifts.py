"""Which stored change points need a bisect: a shift between two stored commits that are not adjacent.

The change-point scan names the first run after a shift; the run before it in the same series
(fingerprint and branch) is the last one before. When git has commits between the two, the
culprit is one of them and ``k2bench bisect`` finds it; when the later commit's parent is the
earlier one, the later commit is the culprit already.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k2bench.harness.history import gitrepo
from k2bench.harness.measure.catalogue import BY_COLUMN


@dataclass(frozen=True)
class Shift:
    fingerprint: str
    metric: str
    concurrency: int
    good: str  # commit of the last run before the shift
    bad: str  # commit of the first run after it
    between: int  # commits after good up to and including bad
    run: dict  # the first run after the shift (its workload and parallelism are bisected)

    @property
    def adjacent(self) -> bool:
        return self.between == 1


def find_shifts(store, repo: Path, branch: str) -> list[Shift]:
    """Stored change points of ``branch`` (catalogue metrics only), each with the commits around it."""
    cps = store.change_points_frame(branch=branch)
    found: dict[tuple, Shift] = {}
    for cp in cps.itertuples():
        if cp.metric not in BY_COLUMN or cp.run_id is None or not cp.commit:
            continue
        runs = [r for r in reversed(store.list_runs(fingerprint=cp.fingerprint, branch=branch, status="complete"))]
        ids = [r["id"] for r in runs]
        if int(cp.run_id) not in ids or ids.index(int(cp.run_id)) == 0:
            continue
        before = runs[ids.index(int(cp.run_id)) - 1]
        after = runs[ids.index(int(cp.run_id))]
        if not before.get("commit") or before["commit"] == after["commit"]:
            continue
        if not gitrepo.is_ancestor(repo, before["commit"], after["commit"]):
            continue
        between = int(gitrepo.git(repo, "rev-list", "--count", f"{before['commit']}..{after['commit']}").strip())
        if (getattr(cp, "mode", None) or "closed") != "closed":
            continue  # bisection re-measures closed levels (--conc); a rate level's shift is reported, not bisected
        key = (cp.fingerprint, cp.metric, int(cp.concurrency), before["commit"], after["commit"])
        found.setdefault(key, Shift(cp.fingerprint, cp.metric, int(cp.concurrency), before["commit"],
                                    after["commit"], between, after))
    return list(found.values())
