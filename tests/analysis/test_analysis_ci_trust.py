"""The PR gate's trust split, by its scripts: the trusted baseline export (ci/pr_baseline.sh), the PR
job's import of it (ci/pr.sh --baseline-dir), and the commenter's checks on the untrusted verdict
(ci/pr_verdict_comment.sh, ci/pr_comment.sh). GitHub is replaced by a fake `gh` that answers from a
fixture and applies `--jq` with the real jq, and logs every write."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from k2bench.harness.record.runjson import load_doc
from k2bench.harness.store import Store

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "ci"
FIXTURES = Path(__file__).parent / "fixtures"
MARKER = "<!-- k2bench-regress -->"
SHA = "b17b8966ef60a9735ef2ab5010b55c11851e9bab"

FAKE_GH = r'''#!/usr/bin/env python3
"""gh api, faked: GETs answer from $GH_FIXTURE (path -> JSON), writes are logged to $GH_LOG."""
import json, os, subprocess, sys
args = sys.argv[2:]  # after "api"
method, jq, fields, path = "GET", None, [], None
while args:
    a = args.pop(0)
    if a == "-X": method = args.pop(0)
    elif a == "--jq": jq = args.pop(0)
    elif a == "-F": fields.append(args.pop(0))
    elif a == "--paginate": pass
    else: path = a
fixture = json.load(open(os.environ["GH_FIXTURE"]))
if method != "GET":
    body = ""
    for f in fields:
        if f.startswith("body=@"): body = open(f[6:]).read()
    with open(os.environ["GH_LOG"], "a") as log:
        log.write(json.dumps({"method": method, "path": path, "body": body}) + "\n")
    sys.exit(0 if path in fixture.get("_writable", [path]) else 1)
if path not in fixture: sys.exit(1)
data = json.dumps(fixture[path])
if jq is None: print(data)
else: sys.exit(subprocess.run(["jq", "-r", jq], input=data, text=True).returncode)
'''


@pytest.fixture
def gh(tmp_path):
    """A fake gh on PATH; returns (env, write log reader, fixture writer)."""
    if not shutil.which("jq"):
        pytest.skip("jq is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    log, fixture = tmp_path / "gh.log", tmp_path / "gh.json"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GITHUB_REPOSITORY": "o/r", "GH_LOG": str(log),
           "GH_FIXTURE": str(fixture), "HOME": str(tmp_path)}

    def writes() -> list[dict]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def answer(data: dict) -> None:
        fixture.write_text(json.dumps(data))

    return env, writes, answer


def _comment(login: str, body: str, cid: int) -> dict:
    return {"id": cid, "user": {"login": login}, "body": body}


def _post(env: dict, body_text: str, pr: str = "7") -> subprocess.CompletedProcess:
    body = Path(env["HOME"]) / "c.md"
    body.write_text(body_text)
    return subprocess.run(["bash", str(CI / "pr_comment.sh"), str(body), pr], capture_output=True, text=True,
                          env=env, timeout=60)


def test_pr_comment_updates_only_its_own_bots_comment(gh):
    env, writes, answer = gh
    answer({"repos/o/r/issues/7/comments": [
        _comment("mallory", f"{MARKER}\nplanted by someone else", 11),
        _comment("github-actions[bot]", "another bot message", 12),
        _comment("github-actions[bot]", f"{MARKER}\nthe gate's own", 13)]})
    res = _post(env, f"{MARKER}\nnew report\n")
    assert res.returncode == 0, res.stderr
    assert [(w["method"], w["path"]) for w in writes()] == [("PATCH", "repos/o/r/issues/comments/13")]


def test_pr_comment_posts_anew_when_only_others_carry_the_marker(gh):
    env, writes, answer = gh
    answer({"repos/o/r/issues/7/comments": [_comment("mallory", f"{MARKER}\nplanted", 11)]})
    res = _post(env, f"{MARKER}\nnew report\n")
    assert res.returncode == 0, res.stderr
    assert [(w["method"], w["path"]) for w in writes()] == [("POST", "repos/o/r/issues/7/comments")]


def test_pr_comment_author_is_configurable_and_checked(gh):
    env, writes, answer = gh
    answer({"repos/o/r/issues/7/comments": [_comment("github-actions[bot]", f"{MARKER}\nx", 12),
                                             _comment("k2-bench[bot]", f"{MARKER}\ny", 14)]})
    res = _post({**env, "K2BENCH_COMMENT_AUTHOR": "k2-bench[bot]"}, f"{MARKER}\nnew\n")
    assert res.returncode == 0, res.stderr
    assert writes()[0]["path"] == "repos/o/r/issues/comments/14"
    bad = _post({**env, "K2BENCH_COMMENT_AUTHOR": 'x" or true or "'}, f"{MARKER}\nnew\n")
    assert bad.returncode == 2 and "not a GitHub login" in bad.stderr and len(writes()) == 1


# --- the commenter's checks on the untrusted verdict ---------------------------------------------------

def _verdict(tmp_path: Path, comment: str | bytes | None = f"{MARKER}\n**k2bench**: no regression\n",
             pr: object = 7, sha: str = SHA) -> Path:
    d = tmp_path / "verdict"
    d.mkdir()
    (d / "verdict.json").write_text(json.dumps({"pr": pr, "head_sha": sha}))
    if isinstance(comment, bytes):
        (d / "comment.md").write_bytes(comment)
    elif comment is not None:
        (d / "comment.md").write_text(comment)
    return d


def _run_commenter(env: dict, folder: Path, **over: str) -> subprocess.CompletedProcess:
    run_env = {**env, "RUN_HEAD_SHA": SHA, "RUN_HEAD_REPO": "fork/r", "RUN_HEAD_BRANCH": "feature",
               "RUN_URL": "https://example.invalid/run/1", "RUN_CONCLUSION": "success", **over}
    return subprocess.run(["bash", str(CI / "pr_verdict_comment.sh"), str(folder)], capture_output=True,
                          text=True, env=run_env, timeout=60)


PR7 = {"repos/o/r/pulls/7": {"head": {"repo": {"full_name": "fork/r"}, "ref": "feature"}},
       "repos/o/r/issues/7/comments": []}


def test_commenter_posts_a_checked_verdict_and_takes_the_label_off(gh, tmp_path):
    env, writes, answer = gh
    answer(PR7)
    res = _run_commenter(env, _verdict(tmp_path))
    assert res.returncode == 0, res.stderr
    post, delete = writes()
    assert (post["method"], post["path"]) == ("POST", "repos/o/r/issues/7/comments")
    assert post["body"].startswith(f"{MARKER}\n**k2bench**: no regression") and SHA in post["body"]
    assert (delete["method"], delete["path"]) == ("DELETE", "repos/o/r/issues/7/labels/benchmark")


def test_commenter_reports_a_run_without_a_report(gh, tmp_path):
    env, writes, answer = gh
    answer(PR7)
    res = _run_commenter(env, _verdict(tmp_path, comment=None), RUN_CONCLUSION="failure")
    assert res.returncode == 0, res.stderr
    body = writes()[0]["body"]
    assert body.startswith(MARKER) and "without a report" in body and "(failure)" in body


@pytest.mark.parametrize("case", ["other_sha", "other_pr_head", "extra_file", "too_big", "no_marker", "nul",
                                  "pr_not_int", "link"])
def test_commenter_refuses_an_untrusted_verdict_it_cannot_check(gh, tmp_path, case):
    env, writes, answer = gh
    answer({**PR7, "repos/o/r/pulls/8": {"head": {"repo": {"full_name": "o/r"}, "ref": "main"}}})
    kw: dict = {}
    if case == "other_sha":
        kw["sha"] = "0" * 40
    elif case == "other_pr_head":
        kw["pr"] = 8  # a real PR, but not the one the workflow run came from
    elif case == "too_big":
        kw["comment"] = MARKER + "\n" + "x" * 70000
    elif case == "no_marker":
        kw["comment"] = "hello\n" + MARKER
    elif case == "nul":
        kw["comment"] = MARKER.encode() + b"\n\x00\n"
    elif case == "pr_not_int":
        kw["pr"] = "7; rm -rf /"
    folder = _verdict(tmp_path, **kw)
    if case == "extra_file":
        (folder / "run.sh").write_text("echo pwned\n")
    elif case == "link":
        (folder / "comment.md").unlink()
        (folder / "comment.md").symlink_to("/etc/passwd")
    res = _run_commenter(env, folder)
    assert res.returncode == 3 and "refusing the artifact" in res.stderr, (res.stdout, res.stderr)
    assert writes() == []


def test_commenter_without_a_verdict_posts_nothing(gh, tmp_path):
    env, writes, answer = gh
    answer(PR7)
    res = _run_commenter(env, tmp_path / "absent")
    assert res.returncode == 0 and "nothing to post" in res.stdout and writes() == []


# --- the baseline: exported by the trusted job, imported by the PR job ---------------------------------

def _history(tmp_path: Path) -> tuple[str, list[dict]]:
    docs = json.loads((FIXTURES / "drop10.json").read_text())["runs"]
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    with Store.open(url) as store:
        for doc in docs:
            store.import_run(doc)
    return url, docs


def _env(**extra: str) -> dict:
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
            **extra}


def test_baseline_export_reads_the_branch_newest_first_and_never_writes(tmp_path):
    url, docs = _history(tmp_path)
    shared = tmp_path / "shared.db"
    before = shared.read_bytes()
    out = tmp_path / "baseline"
    res = subprocess.run(["bash", str(CI / "pr_baseline.sh"), "--branch", "main", "--out", str(out), "--limit", "3"],
                         env=_env(K2BENCH_DB=url), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    exported = [load_doc(p)["run"] for p in sorted(out.glob("*.json"))]
    main_runs = sorted((d["run"] for d in docs if d["run"]["branch"] == "main"), key=lambda r: r["started_at"])
    assert sorted(r["commit"] for r in exported) == sorted(r["commit"] for r in main_runs[-3:])
    assert shared.read_bytes() == before


def test_baseline_export_without_a_database_exports_nothing(tmp_path):
    res = subprocess.run(["bash", str(CI / "pr_baseline.sh"), "--out", str(tmp_path / "b")], env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "no runs exported" in res.stdout
    assert list((tmp_path / "b").iterdir()) == []


def test_pr_gate_imports_the_exported_runs_into_its_private_database(tmp_path):
    url, docs = _history(tmp_path)
    out = tmp_path / "baseline"
    subprocess.run(["bash", str(CI / "pr_baseline.sh"), "--out", str(out)], env=_env(K2BENCH_DB=url),
                   check=True, capture_output=True, timeout=120)
    repo = tmp_path / "repo"
    repo.mkdir()
    git_env = _env(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@x", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@x", HOME=str(tmp_path))
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", *args], cwd=repo, env=git_env, check=True)
    pr_out = tmp_path / "pr"
    res = subprocess.run(["bash", str(CI / "pr.sh"), "--repo", str(repo), "--out", str(pr_out),
                          "--baseline-dir", str(out)], env={**git_env, "K2BENCH_SWEEP_CMD": "exit 5;"},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 3  # the fake sweep fails, after the import
    assert "imported 5 run(s)" in res.stdout
    with Store.open(f"sqlite:///{pr_out / 'k2bench.db'}", readonly=True) as store:
        assert sorted(r["commit"] for r in store.list_runs(branch="main")) == sorted(
            d["run"]["commit"] for d in docs if d["run"]["branch"] == "main")
