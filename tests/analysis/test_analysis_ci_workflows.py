"""Structure check of the GitHub Actions templates (actionlint and zizmor check them too, in
tests/fleet/test_workflows.py).

Parsed with PyYAML; asserts what matters: triggers, permissions, runner labels, the trust split of the PR
gate (the job running a PR's code has no secret and a read-only token; the commenter never checks out
the PR's code), pinned actions, and that the steps call the plain scripts, which exist and are valid bash.
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


PINNED = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")
PIN_LINE = re.compile(r"^\s*(?:- )?uses: ([^\s#]+)\s*#\s*v\d+(?:\.\d+)*\s*$")


def _text(name: str) -> str:
    return (CI / "github" / name).read_text()


def _check_job(job: dict, script: str | None, labels_needed: tuple[str, ...] = ("self-hosted",),
               history: bool = True) -> dict:
    """Keys, runner labels, pinned actions, checkouts without persisted credentials, no expression in a
    shell, explicit least permissions; ``script`` is a ci/ script some step must call."""
    assert set(job) <= ALLOWED_JOB_KEYS, f"unknown job keys: {set(job) - ALLOWED_JOB_KEYS}"
    labels = job["runs-on"]
    assert isinstance(labels, list) and all(label in labels for label in labels_needed)
    assert isinstance(job.get("permissions"), dict), "every job states its own permissions"
    assert "write-all" not in str(job["permissions"]) and "contents" not in {
        k for k, v in job["permissions"].items() if v == "write"}
    steps = job["steps"]
    for step in steps:
        assert set(step) <= ALLOWED_STEP_KEYS, f"unknown step keys: {set(step) - ALLOWED_STEP_KEYS}"
        assert ("uses" in step) != ("run" in step), f"a step needs exactly one of uses/run: {step}"
        if "uses" in step:
            assert PINNED.match(step["uses"]), f"not pinned by a full commit hash: {step['uses']}"
        if "run" in step:  # values reach a shell through env:, never pasted into the script
            assert "${{" not in step["run"], f"expression in a shell script: {step['run']!r}"
    checkouts = [s for s in steps if s.get("uses", "").startswith("actions/checkout@")]
    assert checkouts and all(s["with"]["persist-credentials"] is False for s in checkouts)
    if history:
        assert checkouts[0]["with"]["fetch-depth"] == 0  # merge-base and history need the full graph
    runs = [s["run"] for s in steps if "run" in s]
    if script is not None:
        assert any(re.search(rf"\bbash ci/{script}\b", r) for r in runs), f"no step calls ci/{script}"
    for text in [str(s.get("with", "")) for s in steps] + [str(s.get("env", "")) for s in steps]:
        assert text.count("${{") == text.count("}}"), f"unbalanced expression in {text!r}"
    return job


@pytest.mark.parametrize("name", ["pr.yml", "pr_comment.yml", "nightly.yml"])
def test_every_action_is_pinned_with_its_version_named(name):
    """YAML drops comments: the raw lines must carry `@<40 hex>  # vX.Y.Z`."""
    lines = [line for line in _text(name).splitlines() if "uses:" in line]
    assert lines
    for line in lines:
        m = PIN_LINE.match(line)
        assert m and PINNED.match(m.group(1)), f"not pinned with a version comment: {line.strip()}"


def _secrets_and_tokens(obj) -> str:
    return " ".join(re.findall(r"(secrets\.\w+|github\.token|GITHUB_TOKEN)", str(obj)))


def test_pr_workflow_runs_pr_code_without_secrets_or_write_access():
    doc = _load("pr.yml")
    # approval per commit: only the label event triggers; a later push does not re-run the PR's code
    assert doc["on"] == {"pull_request": {"types": ["labeled"]}}
    assert doc["permissions"] == {}
    assert set(doc["jobs"]) == {"baseline", "benchmark"}
    base, bench = doc["jobs"]["baseline"], doc["jobs"]["benchmark"]
    assert base["if"] == "github.event.label.name == 'benchmark'" and bench["needs"] == "baseline"

    # the job that runs the PR's code: read-only token, no secret, private SQLite, no comment
    _check_job(bench, "pr.sh", ("self-hosted", "gpu"))
    assert bench["permissions"] == {"contents": "read"}
    assert _secrets_and_tokens(bench) == "", "the PR-code job must see no secret or token"
    checkout = next(s for s in bench["steps"] if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["ref"] == "${{ github.event.pull_request.head.sha }}"  # the commit labelled
    step = next(s for s in bench["steps"] if "ci/pr.sh" in s.get("run", ""))
    assert "K2BENCH_DB" not in step["env"] and "unset K2BENCH_DB" in step["run"]
    assert step["env"]["K2BENCH_NO_COMMENT"] == "1" and "GH_TOKEN" not in step["env"]
    assert "--baseline-dir results/baseline" in step["run"]
    uploads = {s["with"]["name"]: s for s in bench["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")}
    assert uploads["k2bench-pr-verdict"]["if"] == "always()"

    # the trusted job: the base commit's code only, a read-only database role, hands runs over as data
    _check_job(base, "pr_baseline.sh")
    assert base["permissions"] == {"contents": "read"}
    checkout = next(s for s in base["steps"] if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["ref"] == "${{ github.event.pull_request.base.sha }}"
    assert "head" not in str(base["steps"]) and "ci/pr.sh" not in str(base["steps"])
    assert _secrets_and_tokens(base) == "secrets.K2BENCH_DB_READ_URL"
    handed = next(s for s in base["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    taken = next(s for s in bench["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert handed["with"]["name"] == taken["with"]["name"] and taken["with"]["path"] == "results/baseline"


def test_commenter_holds_the_write_token_and_never_checks_out_pr_code():
    doc, pr = _load("pr_comment.yml"), _load("pr.yml")
    assert doc["on"] == {"workflow_run": {"workflows": [pr["name"]], "types": ["completed"]}}
    assert doc["permissions"] == {}
    (job,) = doc["jobs"].values()
    _check_job(job, "pr_verdict_comment.sh", history=False)
    assert job["permissions"] == {"actions": "read", "pull-requests": "write", "issues": "write"}
    assert "workflow_run.event == 'pull_request'" in job["if"]
    # the one checkout is ci/ of the default branch: nothing of the PR's (head_sha, head_branch, refs/pull)
    (checkout,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"] == {"ref": "${{ github.event.repository.default_branch }}", "sparse-checkout": "ci",
                                "persist-credentials": False}
    # the artifact is data: downloaded outside the workspace, and only the checked-out script reads it
    download = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"]["name"] == "k2bench-pr-verdict" and download["with"]["path"].startswith("${{ runner.temp }}")
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    runs = [s["run"] for s in job["steps"] if "run" in s]
    assert runs == ['bash ci/pr_verdict_comment.sh "$VERDICT_DIR"']


def test_nightly_workflow_structure():
    doc = _load("nightly.yml")
    trig = doc["on"]
    assert "schedule" in trig and "workflow_dispatch" in trig
    cron = trig["schedule"][0]["cron"]
    assert len(cron.split()) == 5
    assert doc["permissions"] == {}
    # fan-out: plan (the suite as a matrix), bench (one job per entry on its hardware label), scan (fan-in)
    assert set(doc["jobs"]) == {"plan", "bench", "scan"}
    plan, bench, scan = doc["jobs"]["plan"], doc["jobs"]["bench"], doc["jobs"]["scan"]
    _check_job(plan, None)
    assert plan["permissions"] == bench["permissions"] == {"contents": "read"}
    assert "suite matrix" in " ".join(s.get("run", "") for s in plan["steps"]) and "matrix" in plan["outputs"]
    assert bench["needs"] == "plan" and "fromJSON(needs.plan.outputs.matrix)" in bench["strategy"]["matrix"]
    assert "${{ matrix.runner }}" in bench["runs-on"] and bench["strategy"]["fail-fast"] is False
    job = _check_job(bench, None, ("self-hosted",))
    step = next(s for s in job["steps"] if "suite run" in s.get("run", ""))
    assert "secrets.K2BENCH_DB_URL" in step["env"]["K2BENCH_DB"] and "id=$JOB_ID" in step["run"]
    assert scan["needs"] == "bench" and scan["if"] == "always()"
    assert scan["permissions"] == {"contents": "read", "pull-requests": "write"}  # culprit comments only here
    job = _check_job(scan, "nightly_scan.sh", ("self-hosted", "gpu"))
    step = next(s for s in job["steps"] if "ci/nightly_scan.sh" in s.get("run", ""))
    assert "secrets.K2BENCH_DB_URL" in step["env"]["K2BENCH_DB"]
    assert "vars.K2BENCH_BISECT_SERVER_CMD" in step["env"]["K2BENCH_BISECT_SERVER_CMD"]
    # trusted: every checkout is the default branch, never a pull request's code
    for job in doc["jobs"].values():
        for s in job["steps"]:
            if s.get("uses", "").startswith("actions/checkout@"):
                assert s["with"]["ref"] == "${{ github.event.repository.default_branch }}"


@pytest.mark.parametrize("script", ["pr.sh", "nightly.sh", "nightly_scan.sh", "pr_comment.sh", "pr_baseline.sh",
                                    "pr_verdict_comment.sh"])
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


@pytest.mark.parametrize("workflow,script,variable", [("pr.yml", "ci/pr.sh", "K2BENCH_REGRESS_ARGS"),
                                                       ("nightly.yml", "ci/nightly_scan.sh", "K2BENCH_CHANGEPOINT_ARGS")])
def test_gate_arguments_reach_the_scripts_through_env_only(workflow, script, variable):
    """Which metrics the gate judges (--gate-metric) is a repository variable: the step hands it to the
    script in its env, and no step's shell text has an expression spliced into it."""
    doc = _load(workflow)
    steps = [s for job in doc["jobs"].values() for s in job["steps"]]
    step = next(s for s in steps if script in s.get("run", ""))
    assert step["env"][variable] == "${{ vars." + variable + " }}"
    assert not any("vars." in s.get("run", "") for s in steps)
    assert f"${{{variable}:-}}" in (ROOT / script).read_text()
