"""Bisector.profile_pair: around a named culprit, a side whose stored runs kept no profile (a reused
nightly run) is measured once more with --profile-level; a side that has one is not measured again."""

from __future__ import annotations

from dataclasses import dataclass, field

from k2bench.harness.history.bisect import Bisector
from k2bench.harness.history.gitrepo import Commit
from k2bench.harness.run.sweep import SweepConfig
from k2bench.harness.store import Store
from k2bench.workloads.loader import Workload


def _summary(sample_us: float) -> dict:
    return {"format": "k2bench.profile/1", "device": "cpu", "steps": 4, "window_s": 1.0, "ops_total": 2,
            "ops": [{"name": n, "kind": "cpu", "calls": 4, "self_us": us * 4, "total_us": us * 4,
                     "self_us_per_step": us} for n, us in (("engine.sample", sample_us), ("aten::mm", 700.0))]}


@dataclass
class FakeBench:
    """What Bisector needs of a CommitBench; measuring stores a profiled run whose sampling time
    depends on the commit (the culprit's is slower)."""

    cfg: SweepConfig
    slow: str
    measured: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        self.said.append(text)

    def stored_runs(self, store, sha: str) -> list[dict]:
        return sorted(store.list_runs(commit=sha), key=lambda r: r["id"])

    def measure(self, commit: Commit) -> tuple[int, str]:
        self.measured.append(commit.sha)
        with Store.open(self.cfg.db) as store:
            run_id = store.create_run({"engine": "external", "model": "m", "num_gpus": 1, "commit": commit.sha})
            store.set_profile(run_id, {"concurrency": 2, "requests": 4, "completed": 4, "trace": f"/t/{commit.sha}",
                                       "summary": _summary(5000.0 if commit.sha == self.slow else 50.0)})
            store.finish_run(run_id, "complete")
        return run_id, "complete"


def test_the_side_without_a_profile_is_measured_again_profiled(tmp_path) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    good, bad = (Commit(sha, f"c {sha[:4]}", "2026-01-01") for sha in ("a" * 40, "b" * 40))
    cfg = SweepConfig(levels=[2], workload=Workload(name="w", isl=8, osl=4), db=db, profile_level="2:4")
    bench = FakeBench(cfg, slow=bad.sha)
    with Store.open(db) as store:  # the nightly's own run of the good commit: no profile
        old = store.create_run({"engine": "external", "model": "m", "num_gpus": 1, "commit": good.sha})
        store.finish_run(old, "complete")
    bench.measure(bad)  # the culprit was measured during the bisection, profiled
    bench.measured.clear()
    section, doc = Bisector(bench, "tpot_ms_median", 2).profile_pair(good, bad)
    assert bench.measured == [good.sha]  # only the side that had no profile
    assert doc["last good"] == {"run": old + 2, "trace": f"/t/{good.sha}", "commit": good.sha}
    assert doc["first bad"]["commit"] == bad.sha and doc["diff"][0]["name"] == "engine.sample"
    assert doc["diff"][0]["change_us_per_step"] == 4950.0
    assert "| `engine.sample` | cpu | 50.0 | 5,000.0 | +4,950.0 | 100.00x |" in section

    # without --profile-level nothing is measured, and a side without a profile means no section
    bench2 = FakeBench(SweepConfig(levels=[2], workload=Workload(name="w", isl=8, osl=4), db=db), slow=bad.sha)
    other = Commit("c" * 40, "c", "2026-01-02")
    assert Bisector(bench2, "tpot_ms_median", 2).profile_pair(other, bad) == (None, None)
    assert bench2.measured == []
