"""`k2bench regress` / `k2bench changepoints` on a real store filled from the fixture histories.

Expected report text is kept next to the fixtures (fixtures/expected/*.md), as asv does; regenerate
with K2BENCH_UPDATE_EXPECTED=1 after an intended change of the report, and review the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from analysis_data import FIXTURES, load_fixture

from k2bench.harness.cli import main
from k2bench.harness.store import Store

EXPECTED = FIXTURES / "expected"


def _db(tmp_path: Path, name: str, commits: dict[str, str] | None = None) -> tuple[str, dict]:
    url = f"sqlite:///{tmp_path / 'k2.db'}"
    store = Store.open(url)
    fx = load_fixture(name)
    for doc in fx["runs"]:
        if commits:
            doc["run"]["commit"] = commits.get(doc["run"]["tags"]["fixture"], doc["run"]["commit"])
        store.import_run(doc)
    store.close()
    return url, fx


def _cand(fx: dict) -> str:
    return fx["runs"][-1]["run"]["commit"][:12]


@pytest.mark.parametrize("name,rc", [("drop10", 1), ("improve12", 0), ("unlike", 0)])
def test_markdown_report_matches_expected_text(tmp_path, name, rc):
    url, fx = _db(tmp_path, name)
    out = tmp_path / "report.md"
    code = main(["regress", "--candidate", _cand(fx), "--baseline-mode", "latest", "--db", url,
                 "--out", str(out), "--fail-on-regression"])
    assert code == rc
    text = out.read_text()
    expected = EXPECTED / f"{name}.md"
    if os.environ.get("K2BENCH_UPDATE_EXPECTED"):
        expected.parent.mkdir(exist_ok=True)
        expected.write_text(text)
    assert text == expected.read_text()
    if name != "unlike":
        png = tmp_path / "report.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "![frontiers](report.png)" in text


def test_json_report_is_machine_readable(tmp_path, capsys):
    url, fx = _db(tmp_path, "drop10")
    assert main(["regress", "--candidate", _cand(fx), "--baseline-mode", "latest", "--db", url,
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "k2bench.regress/1" and doc["overall"] == "regression"
    regs = [(v["metric"], v["concurrency"]) for v in doc["verdicts"] if v["status"] == "regression"]
    assert regs == [("tput_per_gpu", 16)]
    assert doc["baseline_runs"] == [1, 2, 3, 4, 5]


def test_explicit_unlike_baseline_is_refused_with_the_reason(tmp_path, capsys):
    url, fx = _db(tmp_path, "unlike")
    code = main(["regress", "--candidate", _cand(fx), "--baseline", "1", "--db", url])
    err = capsys.readouterr().err
    assert code == 2
    assert "baseline refused" in err and "engine_version" in err and "osl (256 vs 128)" in err


def test_bad_threshold_is_a_user_error(tmp_path, capsys):
    url, fx = _db(tmp_path, "drop10")
    assert main(["regress", "--candidate", _cand(fx), "--db", url, "--threshold", "five"]) == 2
    assert main(["regress", "--candidate", _cand(fx), "--db", url, "--threshold", "150%"]) == 2
    assert main(["regress", "--candidate", "deadbeef00", "--db", url]) == 2
    assert "no usable run" in capsys.readouterr().err


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_auto_baseline_is_the_merge_base_not_the_newest_main_run(tmp_path, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    for msg in ("a", "b"):
        (repo / "f").write_text(msg)
        _git(repo, "add", "f")
        _git(repo, "commit", "-q", "-m", msg)
    fork = _git(repo, "rev-parse", "HEAD~1")
    newest_main = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", "feature", fork)
    (repo / "g").write_text("x")
    _git(repo, "add", "g")
    _git(repo, "commit", "-q", "-m", "feature")
    head = _git(repo, "rev-parse", "HEAD")
    # main-00..03 at the fork point, main-04 (newest) after it; the candidate on the feature branch
    commits = {f"main-0{i}": fork for i in range(4)} | {"main-04": newest_main, "pr-drop10": head}
    url, _ = _db(tmp_path, "drop10", commits)
    assert main(["regress", "--candidate", "HEAD", "--repo", str(repo), "--db", url, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["baseline_runs"] == [1, 2, 3, 4]
    assert doc["baseline_reason"].startswith(f"merge-base {fork[:10]} of main")


def test_changepoints_command_lists_and_stores(tmp_path, capsys):
    url, fx = _db(tmp_path, "step60")
    assert main(["changepoints", "--branch", "main", "--metric", "tput_per_gpu", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "5 change point(s)" in out and fx["expected"]["commit"][:10] in out
    frame = Store.open(url, readonly=True).change_points_frame(branch="main")
    assert len(frame) == 5 and set(frame["commit"]) == {fx["expected"]["commit"]}
    assert set(frame["run_id"]) == {fx["expected"]["index"] + 1}
    # rerunning replaces, never duplicates
    assert main(["changepoints", "--branch", "main", "--metric", "tput_per_gpu", "--db", url]) == 0
    assert len(Store.open(url, readonly=True).change_points_frame(branch="main")) == 5
    assert main(["changepoints", "--branch", "main", "--fingerprint", "nope", "--db", url]) == 2


def test_changepoints_of_one_metric_keep_the_other_metrics_stored(tmp_path, capsys):
    url, fx = _db(tmp_path, "step60")
    store = Store.open(url)
    fp = store.list_runs()[0]["fingerprint"]
    other = {"metric": "ttft_ms_p99", "concurrency": 4, "run_id": 3, "commit": "abc", "detected_at": None,
             "mean_before": 100.0, "mean_after": 130.0, "rel_change": 0.3, "p_value": 1e-5}
    store.replace_change_points(fp, "main", [other])
    store.close()
    assert main(["changepoints", "--branch", "main", "--metric", "tput_per_gpu", "--db", url]) == 0
    frame = Store.open(url, readonly=True).change_points_frame(fingerprint=fp, branch="main")
    assert sorted(frame["metric"]) == ["tput_per_gpu"] * 5 + ["ttft_ms_p99"]
    kept = frame[frame["metric"] == "ttft_ms_p99"].iloc[0]
    assert (kept["concurrency"], kept["run_id"], kept["commit"], kept["rel_change"]) == (4, 3, "abc", 0.3)


def test_changepoints_of_an_unknown_metric_is_a_user_error(tmp_path, capsys):
    url, _ = _db(tmp_path, "step60")
    assert main(["changepoints", "--branch", "main", "--metric", "tput_per_gpux", "--db", url]) == 2
    assert "tput_per_gpux" in capsys.readouterr().err


def test_threshold_parsing():
    from k2bench.harness.commands.regress import parse_thresholds

    assert parse_thresholds(["5%"]) == (0.05, {})
    assert parse_thresholds(["0.03", "ttft_ms_p99=10%", "frontier=0.02"]) == (0.03, {"ttft_ms_p99": 0.10,
                                                                                 "frontier": 0.02})


def test_per_metric_threshold_from_the_command_line(tmp_path, capsys):
    url, fx = _db(tmp_path, "drop10")
    assert main(["regress", "--candidate", _cand(fx), "--baseline-mode", "latest", "--db", url, "--format", "json",
                 "--threshold", "tput_per_gpu=15%", "--fail-on-regression"]) == 0
    doc = json.loads(capsys.readouterr().out)
    v = next(v for v in doc["verdicts"] if v["metric"] == "tput_per_gpu" and v["concurrency"] == 16)
    assert v["threshold"] == 0.15 and v["status"] == "unchanged"


def test_changepoints_names_each_series_and_what_a_short_one_lacks(tmp_path, capsys):
    """Seen by a newcomer (issue 16): `fingerprint ddd10739d6a5c009: 2 run(s), 0 change point(s)`, an
    opaque id and no word on how many runs a scan needs."""
    url, fx = _db(tmp_path, "step60")
    assert main(["changepoints", "--branch", "main", "--metric", "tput_per_gpu", "--db", url]) == 0
    out = capsys.readouterr().out
    run = fx["runs"][0]["run"]
    assert out.startswith(f"{run['engine']} · {run['model']}") and run["hardware"] in out.splitlines()[0]
    assert "needs at least" not in out  # a long series says nothing about length
    short = f"sqlite:///{tmp_path / 'short.db'}"
    store = Store.open(short)
    for doc in fx["runs"][:2]:
        store.import_run(doc)
    store.close()
    assert main(["changepoints", "--branch", "main", "--metric", "tput_per_gpu", "--db", short]) == 0
    assert "2 run(s), 0 change point(s); finding a change needs at least 6 runs (4 more)" in capsys.readouterr().out
