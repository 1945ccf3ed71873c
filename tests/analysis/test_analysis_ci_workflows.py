"""Structure check of the GitHub Actions templates (actionlint cannot be built offline here).

Parsed with PyYAML; asserts what matters: triggers, permissions, runner labels, and that the steps
call the plain scripts, which exist and are valid bash.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "ci"
ALLOWED_JOB_KEYS = {"if", "runs-on", "timeout-minutes", "steps", "env", "permissions", "needs", "concurrency",
                    "strategy", "outputs", "name", "environment", "defaults", "container", "services"}
ALLOWED_STEP_KEYS = {"name", "uses", "with", "run", "env", "if", "id", "shell", "working-directory",
                     "continue-on-error", "timeout-minutes"}


def _load(name: str) -> dict:
    doc = yaml.safe_load((CI / "github" / name).read_text())
    # YAML 1.1 reads the bare key `on` as boolean True
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def _check_common(doc: dict, script: str) -> dict:
    assert isinstance(doc.get("name"), str) and doc["jobs"]
    (job_name, job), = doc["jobs"].items()
    return _check_job(job, script)


def _check_job(job: dict, script: str | None, labels_needed: tuple[str, ...] = ("self-hosted", "gpu")) -> dict:
    assert set(job) <= ALLOWED_JOB_KEYS, f"unknown job keys: {set(job) - ALLOWED_JOB_KEYS}"
    labels = job["runs-on"]
    assert isinstance(labels, list) and all(label in labels for label in labels_needed)
    steps = job["steps"]
    for step in steps:
        assert set(step) <= ALLOWED_STEP_KEYS, f"unknown step keys: {set(step) - ALLOWED_STEP_KEYS}"
        assert ("uses" in step) != ("run" in step), f"a step needs exactly one of uses/run: {step}"
    uses = [s["uses"] for s in steps if "uses" in s]
    assert any(u.startswith("actions/checkout@v") for u in uses)
    checkout = next(s for s in steps if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0  # merge-base and history need the full graph
    runs = [s["run"] for s in steps if "run" in s]
    if script is not None:
        assert any(re.search(rf"\bbash ci/{script}\b", r) for r in runs), f"no step calls ci/{script}"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()"
    for text in runs + [str(s.get("with", "")) for s in steps] + [str(s.get("env", "")) for s in steps]:
        assert text.count("${{") == text.count("}}"), f"unbalanced expression in {text!r}"
    return job


def test_pr_workflow_structure():
    doc = _load("pr.yml")
    trig = doc["on"]
    assert set(trig) == {"pull_request"}
    assert "labeled" in trig["pull_request"]["types"] and "synchronize" in trig["pull_request"]["types"]
    assert doc["permissions"]["pull-requests"] == "write" and doc["permissions"]["contents"] == "read"
    job = _check_common(doc, "pr.sh")
    assert "'benchmark'" in job["if"] and "labels" in job["if"]
    step = next(s for s in job["steps"] if "ci/pr.sh" in s.get("run", ""))
    assert {"PR_NUMBER", "GH_TOKEN", "GITHUB_REPOSITORY", "K2BENCH_DB"} <= set(step["env"])
    assert "secrets.K2BENCH_DB_URL" in step["env"]["K2BENCH_DB"]
    checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@"))
    assert "pull_request.head.sha" in checkout["with"]["ref"]  # the PR head, not GitHub's merge commit


def test_nightly_workflow_structure():
    doc = _load("nightly.yml")
    trig = doc["on"]
    assert "schedule" in trig and "workflow_dispatch" in trig
    cron = trig["schedule"][0]["cron"]
    assert len(cron.split()) == 5
    assert doc["permissions"] == {"contents": "read"}
    # fan-out: plan (the suite as a matrix), bench (one job per entry on its hardware label), scan (fan-in)
    assert set(doc["jobs"]) == {"plan", "bench", "scan"}
    plan, bench, scan = doc["jobs"]["plan"], doc["jobs"]["bench"], doc["jobs"]["scan"]
    assert "suite matrix" in " ".join(s.get("run", "") for s in plan["steps"]) and "matrix" in plan["outputs"]
    assert bench["needs"] == "plan" and "fromJSON(needs.plan.outputs.matrix)" in bench["strategy"]["matrix"]
    assert "${{ matrix.runner }}" in bench["runs-on"] and bench["strategy"]["fail-fast"] is False
    job = _check_job(bench, None, ("self-hosted",))
    step = next(s for s in job["steps"] if "suite run" in s.get("run", ""))
    assert "secrets.K2BENCH_DB_URL" in step["env"]["K2BENCH_DB"] and "id=$JOB_ID" in step["run"]
    assert scan["needs"] == "bench" and scan["if"] == "always()"
    assert scan["permissions"] == {"contents": "read", "pull-requests": "write"}  # culprit comments only here
    job = _check_job(scan, "nightly_scan.sh")
    step = next(s for s in job["steps"] if "ci/nightly_scan.sh" in s.get("run", ""))
    assert "secrets.K2BENCH_DB_URL" in step["env"]["K2BENCH_DB"]
    assert "vars.K2BENCH_BISECT_SERVER_CMD" in step["env"]["K2BENCH_BISECT_SERVER_CMD"]


@pytest.mark.parametrize("script", ["pr.sh", "nightly.sh", "nightly_scan.sh", "pr_comment.sh"])
def test_scripts_are_valid_bash_with_help(script):
    path = CI / script
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    out = subprocess.run(["bash", str(path), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: ci/" in out.stdout
    bad = subprocess.run(["bash", str(path), "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and ("unknown argument" in bad.stderr or "usage:" in bad.stderr)


def test_pr_comment_refuses_a_body_without_the_marker(tmp_path):
    body = tmp_path / "c.md"
    body.write_text("no marker here\n")
    res = subprocess.run(["bash", str(CI / "pr_comment.sh"), str(body), "3"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "GITHUB_REPOSITORY": "o/r"})
    assert res.returncode == 2 and "refusing" in res.stderr


def test_pr_script_refuses_an_unknown_baseline_sweep_policy(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git_env = {"PATH": "/usr/bin:/bin", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x", "HOME": str(tmp_path)}
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", *args], cwd=repo, env=git_env, check=True)
    env = {**git_env, "K2BENCH_SWEEP_CMD": "touch swept; false", "K2BENCH_BASELINE_SWEEP": "Always"}
    res = subprocess.run(["bash", str(CI / "pr.sh"), "--repo", str(repo), "--out", str(tmp_path / "out")],
                         env=env, capture_output=True, text=True, timeout=60)
    # a typo must not quietly mean "auto": usage error before any sweep
    assert res.returncode == 2 and "K2BENCH_BASELINE_SWEEP" in res.stderr
    assert not (repo / "swept").exists()


def test_pr_comment_survives_a_long_paginated_comment_listing(tmp_path):
    """gh may still be writing later pages after the first matching id: reading only the first line
    must not kill it with SIGPIPE (which pipefail turns into a failed comment step)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    gh.write_text('#!/usr/bin/env bash\nif [ "$2" = -X ]; then echo "$*" >> "$GH_LOG"; exit 0; fi\n'
                  "seq 42 400000\n")  # the listing: far more than a pipe buffer of matching ids
    gh.chmod(0o755)
    body = tmp_path / "c.md"
    body.write_text("<!-- k2bench-regress -->\nreport\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GITHUB_REPOSITORY": "o/r", "GH_LOG": str(tmp_path / "gh.log")}
    res = subprocess.run(["bash", str(CI / "pr_comment.sh"), str(body), "7"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "gh.log").read_text().startswith("api -X PATCH repos/o/r/issues/comments/42 ")
