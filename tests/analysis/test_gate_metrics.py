"""Which metrics the gate judges (--gate-metric): the grammar, and `regress`, `changepoints` and `bisect`
pointed at a steady-state metric that the default gated set leaves out.

The stored runs are the committed fixtures' documents with steady-state figures written into their
levels, so each test knows what moved and by how much; the gate's statistics decide the rest.
"""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from analysis_data import load_fixture

from k2bench.errors import UserError
from k2bench.harness.analysis import gate_metrics
from k2bench.harness.cli import main
from k2bench.harness.measure.catalogue import BY_COLUMN, GATE_METRICS
from k2bench.harness.store import Store

DEFAULT = tuple(m.column for m in GATE_METRICS)
STEADY = "steady_tput_per_gpu"
TRIALS = 5  # 5 against 5 trials: a clean separation gives a Mann-Whitney p of 1/252, below alpha 0.01


# ---------------------------------------------------------------- the grammar

def test_no_selection_is_the_catalogues_gated_set():
    sel = gate_metrics.parse(None)
    assert sel.metrics == DEFAULT and sel.is_default and STEADY not in sel.metrics
    assert "tput_per_gpu" in sel.metrics and "tpot_ms_p99" in sel.metrics


def test_a_plain_name_replaces_the_default_set():
    sel = gate_metrics.parse([STEADY])
    assert sel.metrics == (STEADY,) and sel.named == (STEADY,)


def test_a_plus_name_adds_to_the_default_set():
    sel = gate_metrics.parse([f"+{STEADY}"])
    assert sel.metrics == (*DEFAULT, STEADY) and sel.named == (STEADY,)
    # adding one that is already judged changes nothing
    assert gate_metrics.parse(["+tput_per_gpu"]).metrics == DEFAULT


def test_commas_and_repeats_combine_plain_and_added_names():
    assert gate_metrics.parse(["tput_per_gpu,tpot_ms_p99"]).metrics == ("tput_per_gpu", "tpot_ms_p99")
    assert gate_metrics.parse(["tput_per_gpu", "tpot_ms_p99"]).metrics == ("tput_per_gpu", "tpot_ms_p99")
    # the added names go after the plain ones, whatever order they came in
    sel = gate_metrics.parse([f"+{STEADY}", "tpot_ms_p99, steady_tpot_ms_p99"])
    assert sel.metrics == ("tpot_ms_p99", "steady_tpot_ms_p99", STEADY)


@pytest.mark.parametrize("value", ["speed", "+speed", f"{STEADY},speed", "tput_per_gpu,,tpot_ms_p99", "+", ""])
def test_unknown_or_empty_names_are_refused(value):
    with pytest.raises(UserError) as err:
        gate_metrics.parse([value])
    text = str(err.value)
    assert "--gate-metric" in text
    if "speed" in value:  # the message names the culprit and lists every valid name
        assert "'speed'" in text and all(name in text for name in BY_COLUMN)


def test_bisect_takes_exactly_one_metric_of_the_whole_catalogue():
    assert gate_metrics.one(STEADY) is BY_COLUMN[STEADY]
    for bad in ("tput_per_gpu,tpot_ms_p99", f"+{STEADY}"):
        with pytest.raises(UserError, match="exactly one"):
            gate_metrics.one(bad)
    with pytest.raises(UserError, match="not in the catalogue"):
        gate_metrics.one("speed")


# ---------------------------------------------------------------- regress over two stored runs

def _with_trials(doc: dict, rng, steady: float, started_at: str, commit: str) -> dict:
    """The fixture run with TRIALS trials per level: every figure jittered by 0.5%, and a steady-state
    tok/s/GPU of ``steady`` times the level's tok/s/GPU."""
    out = copy.deepcopy(doc)
    out["run"].update(started_at=started_at, commit=commit, trials=TRIALS)
    points = []
    for p in doc["points"]:
        for trial in range(TRIALS):
            q = copy.deepcopy(p)
            q["trial"] = trial
            jitter = 1 + 0.005 * rng.standard_normal()
            for key in ("tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu"):
                q[key] = p[key] * jitter
            for group in ("interactivity", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
                q[group] = {k: v * (1 + 0.005 * rng.standard_normal()) for k, v in p[group].items()}
            q[STEADY] = steady * p["tput_per_gpu"] * (1 + 0.005 * rng.standard_normal())
            points.append(q)
    out["points"] = points
    return out


@pytest.fixture
def two_runs(tmp_path) -> str:
    """Run 1 (baseline) and run 2 (candidate, commit 'c' * 40): the same in every figure but steady-state
    tok/s/GPU, which is 20% lower in the candidate."""
    url = f"sqlite:///{tmp_path / 'k2.db'}"
    base = load_fixture("drop10")["runs"][0]
    rng = np.random.default_rng(24)
    with Store.open(url) as store:
        store.import_run(_with_trials(base, rng, 0.95, "2026-11-01T00:00:00+00:00", "b" * 40))
        store.import_run(_with_trials(base, rng, 0.95 * 0.8, "2026-11-02T00:00:00+00:00", "c" * 40))
    return url


def _regress(url: str, capsys, *extra: str) -> tuple[int, dict]:
    code = main(["regress", "--candidate", "2", "--baseline", "1", "--db", url, "--format", "json",
                 "--fail-on-regression", *extra])
    return code, json.loads(capsys.readouterr().out)


def _statuses(doc: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for v in doc["verdicts"]:
        out.setdefault(v["metric"], set()).add(v["status"])
    return out


LEVELS = {4, 8, 16, 32, 64}


def test_a_steady_state_drop_passes_the_default_gate(two_runs, capsys):
    code, doc = _regress(two_runs, capsys)
    assert code == 0 and doc["overall"] == "unchanged", _statuses(doc)
    assert STEADY not in _statuses(doc)
    assert _statuses(doc)["tput_per_gpu"] == {"unchanged"}


def test_adding_the_steady_state_metric_flags_the_drop(two_runs, capsys):
    code, doc = _regress(two_runs, capsys, "--gate-metric", f"+{STEADY}")
    statuses = _statuses(doc)
    assert code == 1 and doc["overall"] == "regression"
    assert statuses[STEADY] == {"regression"}
    steady = [v for v in doc["verdicts"] if v["metric"] == STEADY]
    assert {v["concurrency"] for v in steady} == LEVELS
    for v in steady:
        assert v["rel_change"] == pytest.approx(-0.2, abs=0.02) and v["mw_source"] == "trials" and v["mw_p"] < 0.01
    # the default set is still judged, and unchanged; so is the frontier
    assert set(DEFAULT[:8]) <= set(statuses) and statuses["tpot_ms_p99"] == {"unchanged"}
    assert doc["frontier"] is not None and doc["frontier"]["status"] == "unchanged"


def test_naming_only_the_steady_state_metric_judges_only_it(two_runs, capsys):
    code, doc = _regress(two_runs, capsys, "--gate-metric", STEADY)
    assert code == 1 and doc["overall"] == "regression"
    assert set(_statuses(doc)) == {STEADY}
    assert doc["frontier"] is None  # the frontier is tok/s/GPU against tok/s/user, neither of them chosen


def test_the_markdown_report_shows_the_chosen_metric(two_runs, tmp_path, capsys):
    out = tmp_path / "r.md"
    assert main(["regress", "--candidate", "2", "--baseline", "1", "--db", two_runs, "--out", str(out),
                 "--gate-metric", f"+{STEADY}"]) == 0
    text = out.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| conc |"))
    assert BY_COLUMN[STEADY].short in header and "tok/s/GPU" in header
    rows = [line for line in text.splitlines() if line.startswith(f"| {BY_COLUMN[STEADY].short} |")]
    assert len(rows) == len(LEVELS) and all(line.endswith("| regression |") for line in rows)


def test_a_chosen_metric_without_data_is_reported_not_passed(two_runs, capsys):
    code, doc = _regress(two_runs, capsys, "--gate-metric", "+steady_tpot_ms_p99")
    assert code == 0
    assert _statuses(doc)["steady_tpot_ms_p99"] == {"missing"}
    assert any(n.startswith("steady_tpot_ms_p99 (chosen with --gate-metric) has no value") for n in doc["notes"])
    # a default metric never measured here (J/token) stays out quietly, as before
    assert "j_per_token" not in _statuses(doc) and not any("j_per_token" in n for n in doc["notes"])


def test_bad_selections_are_one_line_usage_errors(two_runs, capsys):
    assert main(["regress", "--candidate", "2", "--db", two_runs, "--gate-metric", "speed"]) == 2
    err = capsys.readouterr().err
    assert "'speed' not in the catalogue" in err and STEADY in err and err.count("\n") == 1
    # a threshold for a metric that is not judged would be dropped silently: it is refused instead
    assert main(["regress", "--candidate", "2", "--db", two_runs, "--threshold", f"{STEADY}=10%"]) == 2
    err = capsys.readouterr().err
    assert f"--gate-metric +{STEADY}" in err
    code, _ = _regress(two_runs, capsys, "--gate-metric", f"+{STEADY}", "--threshold", f"{STEADY}=30%")
    assert code == 0  # a 20% drop under a 30% threshold


# ---------------------------------------------------------------- changepoints on a chosen metric

@pytest.fixture
def step_history(tmp_path) -> tuple[str, dict]:
    """The 60-run 'step60' history (tok/s/GPU 12% lower from run 41) with a steady-state tok/s/GPU
    that drops 15% from run 21 instead."""
    url = f"sqlite:///{tmp_path / 'k2.db'}"
    fx = load_fixture("step60")
    rng = np.random.default_rng(60)
    with Store.open(url) as store:
        for i, doc in enumerate(fx["runs"]):
            for p in doc["points"]:
                p[STEADY] = (850.0 if i >= 20 else 1000.0) * (1 + 0.01 * rng.standard_normal())
            store.import_run(doc)
    return url, fx


def _listed(out: str) -> dict[str, set[str]]:
    """metric -> commits (10 characters) of the change points a scan printed."""
    found: dict[str, set[str]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[0] in BY_COLUMN and parts[1] == "conc":  # metric conc N run #ID COMMIT ...
            found.setdefault(parts[0], set()).add(parts[5])
    return found


def test_changepoints_scan_the_chosen_metric(step_history, capsys):
    url, fx = step_history
    steady_at, tput_at = fx["runs"][20]["run"]["commit"][:10], fx["expected"]["commit"][:10]
    assert main(["changepoints", "--branch", "main", "--db", url, "--no-store"]) == 0
    default = _listed(capsys.readouterr().out)
    assert STEADY not in default and default["tput_per_gpu"] == {tput_at}

    assert main(["changepoints", "--branch", "main", "--db", url, "--gate-metric", STEADY]) == 0
    listed = _listed(capsys.readouterr().out)
    assert set(listed) == {STEADY} and steady_at in listed[STEADY] and tput_at not in listed[STEADY]
    stored = Store.open(url, readonly=True).change_points_frame(branch="main")
    assert set(stored["metric"]) == {STEADY}
    step = stored[stored["run_id"] == 21]  # the first run of the lower regime, at every level
    assert sorted(step["concurrency"]) == sorted(LEVELS)
    assert np.allclose(step["rel_change"], -0.15, atol=0.01)
    # anything else is the scan's known false-positive rate on noise (about 1.5% of series): small
    assert (stored[stored["run_id"] != 21]["rel_change"].abs() < 0.03).all()

    assert main(["changepoints", "--branch", "main", "--db", url, "--no-store",
                 "--gate-metric", f"+{STEADY},+steady_itl_ms_p99"]) == 0
    out = capsys.readouterr().out
    listed = _listed(out)
    assert set(listed) == {"tput_per_gpu", STEADY} and listed["tput_per_gpu"] == {tput_at}
    assert steady_at in listed[STEADY]
    assert "steady_itl_ms_p99" in out and "no value in this series" in out
    # --metric keeps working, as plain names
    assert main(["changepoints", "--branch", "main", "--db", url, "--no-store", "--metric", STEADY]) == 0
    assert set(_listed(capsys.readouterr().out)) == {STEADY}
    assert main(["changepoints", "--branch", "main", "--db", url, "--gate-metric", "+speed"]) == 2


# ---------------------------------------------------------------- bisect on a steady-state metric

def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "k2", "GIT_AUTHOR_EMAIL": "k2@example.com", "GIT_COMMITTER_NAME": "k2",
           "GIT_COMMITTER_EMAIL": "k2@example.com", "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@dataclass
class StoredBench:
    """What Bisector needs of a CommitBench, without servers: measuring a commit stores the fixture's
    run at one level with TRIALS trials, whose steady-state tok/s/GPU drops 30% from commit ``slow``
    on while every other figure stays."""

    cfg: object
    repo: Path
    shas: list[str]
    slow: int
    measured: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        self.said.append(text)

    def stored_runs(self, store, sha: str) -> list[dict]:
        return sorted(store.list_runs(commit=sha), key=lambda r: r["id"])

    def measure(self, commit) -> tuple[int, str]:
        self.measured.append(commit.sha)
        doc = load_fixture("drop10")["runs"][0]
        doc["points"] = [p for p in doc["points"] if p["concurrency"] == 4]
        rng = np.random.default_rng(len(self.measured))
        steady = 0.95 * (0.7 if self.shas.index(commit.sha) >= self.slow else 1.0)
        doc = _with_trials(doc, rng, steady, f"2026-11-{len(self.measured):02d}T00:00:00+00:00", commit.sha)
        with Store.open(self.cfg.db) as store:
            return store.import_run(doc), "complete"


def test_bisect_decides_on_a_steady_state_metric(tmp_path):
    from k2bench.harness.history.bisect import Bisector
    from k2bench.harness.run.sweep import SweepConfig
    from k2bench.workloads.loader import Workload

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for i in range(10):
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"c{i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    cfg = SweepConfig(levels=[4], workload=Workload(name="w", isl=8, osl=4), db=f"sqlite:///{tmp_path}/k.db")
    bench = StoredBench(cfg, repo, shas, slow=6)
    result = Bisector(bench, STEADY, 4).run(shas[0], shas[-1])
    assert result.first_bad is not None and result.first_bad.sha == shas[6], result.message
    assert result.last_good.sha == shas[5]
    assert {s.verdict for s in result.steps[2:]} <= {"good", "bad"}
    for s in result.steps:
        assert (s.verdict == "bad") == (shas.index(s.commit.sha) >= 6)
    # the same runs judged on tok/s/GPU (unchanged): nothing to bisect, and nothing measured again
    before = len(bench.measured)
    result = Bisector(bench, "tput_per_gpu", 4).run(shas[0], shas[-1])
    assert result.first_bad is None and "nothing to bisect" in result.message
    assert len(bench.measured) == before


def test_bisect_refuses_an_unknown_metric_with_the_valid_names(tmp_path):
    from k2bench.harness.history.bisect import Bisector
    from k2bench.harness.run.sweep import SweepConfig
    from k2bench.workloads.loader import Workload

    cfg = SweepConfig(levels=[4], workload=Workload(name="w", isl=8, osl=4), db=f"sqlite:///{tmp_path}/k.db")
    with pytest.raises(UserError, match="not in the catalogue") as err:
        Bisector(StoredBench(cfg, tmp_path, [], 0), "speed", 4)
    assert STEADY in str(err.value)
