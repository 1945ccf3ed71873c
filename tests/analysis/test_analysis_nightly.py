"""ci/nightly.sh end to end with a stand-in sweep command (imports a fixture run with the commit and
branch the script passes), over a stored 59-run history whose last 18 runs are 12% slower: the
script stores tonight's run, finds the change point at the right commit and writes its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from analysis_data import load_fixture

from k2bench.harness.store import Store

ROOT = Path(__file__).resolve().parents[2]

FAKE_SWEEP = r"""
import argparse, json, sys
from k2bench.harness.store import Store
ap = argparse.ArgumentParser()
for flag in ("--commit", "--branch", "--db", "--json"):
    ap.add_argument(flag)
args = ap.parse_args(sys.argv[1:])
doc = json.load(open("tonight.json"))
doc["run"].update(commit=args.commit, branch=args.branch, started_at="2026-12-01T03:17:00Z")
Store.open(args.db).import_run(doc)
json.dump(doc, open(args.json, "w"))
"""


@pytest.mark.slow
def test_nightly_script_stores_run_change_points_and_report(tmp_path):
    fx = load_fixture("step60")
    db = f"sqlite:///{tmp_path / 'k2.db'}"
    store = Store.open(db)
    for doc in fx["runs"][:-1]:
        store.import_run(doc)
    store.close()
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "fake_sweep.py").write_text(FAKE_SWEEP)
    (repo / "tonight.json").write_text(json.dumps(fx["runs"][-1]))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "K2BENCH_DB": db, "K2BENCH_SWEEP_CMD": "python fake_sweep.py",
           "K2BENCH_CHANGEPOINT_ARGS": "--metric tput_per_gpu"}
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "tonight"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(ROOT / "ci" / "nightly.sh"), "--repo", str(repo), "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (out / f"run-{sha[:10]}.json").exists()
    assert fx["expected"]["commit"][:10] in (out / "changepoints.txt").read_text()
    cps = Store.open(db, readonly=True).change_points_frame(branch="main")
    assert set(cps["commit"]) == {fx["expected"]["commit"]} and len(cps) == 5
    report = (out / "nightly.md").read_text()
    assert f"`{sha[:10]}`" in report and "latest 5 main run(s)" in report
    assert "(secret URL from K2BENCH_DB)" in res.stdout and db not in res.stdout  # the database URL is never printed
