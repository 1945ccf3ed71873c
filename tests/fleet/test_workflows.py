"""The GitHub Actions templates pass actionlint and zizmor (both from the dev extra), with the suites'
runner labels."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from k2bench.harness.plan import suites

ROOT = Path(__file__).resolve().parents[2]
GH = ROOT / "ci" / "github"
CONFIG = GH / "actionlint.yaml"


def _actionlint() -> str:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip("actionlint is not installed (pip install -e '.[dev]' brings it)")
    return found


def test_workflows_pass_actionlint() -> None:
    files = sorted(GH.glob("*.yml"))
    assert {f.name for f in files} >= {"nightly.yml", "pr.yml", "pr_comment.yml"}
    out = subprocess.run([_actionlint(), "-config-file", str(CONFIG), "-no-color", *map(str, files)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path) -> None:
    """The check can fail: an unknown runner label and a bad expression are reported."""
    bad = tmp_path / "bad.yml"
    bad.write_text((GH / "nightly.yml").read_text()
                   .replace("runs-on: [self-hosted, linux, gpu]", "runs-on: [self-hosted, linux, tpu9000]")
                   .replace("fromJSON(needs.plan.outputs.matrix)", "fromJSON(needs.nope.outputs.matrix)"))
    out = subprocess.run([_actionlint(), "-config-file", str(CONFIG), "-no-color", str(bad)],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "tpu9000" in out.stdout and "needs.nope" in out.stdout


def test_runner_labels_of_the_shipped_suites_are_known_to_actionlint() -> None:
    import yaml

    labels = set(yaml.safe_load(CONFIG.read_text())["self-hosted-runner"]["labels"])
    for path in (ROOT / "suites").glob("*.toml"):
        for job in suites.load(path).jobs:
            assert (job.get("hardware") or "gpu") in labels, (path.name, job.id)


def _zizmor(*paths: Path) -> subprocess.CompletedProcess:
    found = shutil.which("zizmor") or shutil.which("zizmor", path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip("zizmor is not installed (pip install -e '.[dev]' brings it)")
    # offline: CI cannot reach GitHub; JSON: findings by severity, whatever the terminal
    return subprocess.run([found, "--offline", "--no-progress", "--format", "json", "--min-severity", "high",
                           *map(str, paths)], capture_output=True, text=True)


def test_workflows_have_no_high_zizmor_finding() -> None:
    out = _zizmor(*sorted(GH.glob("*.yml")))
    assert out.returncode == 0 and json.loads(out.stdout) == [], out.stdout + out.stderr


def test_the_only_zizmor_ignore_is_the_commenters_trigger() -> None:
    """An ignore comment hides a finding: the one allowed is workflow_run on the commenter, which by
    design checks out no PR code and treats the artifact as data (docs/ci.md)."""
    ignores = [(f.name, line.strip()) for f in sorted(GH.glob("*.yml")) for line in f.read_text().splitlines()
               if "zizmor:" in line]
    assert len(ignores) == 1 and ignores[0][0] == "pr_comment.yml"
    assert ignores[0][1].startswith("workflow_run:  # zizmor: ignore[dangerous-triggers]")


def test_zizmor_catches_the_old_pr_workflow(tmp_path) -> None:
    """The check can fail: a tag-pinned action and a pull request's title pasted
    into a shell are each a high finding."""
    bad = tmp_path / "bad.yml"
    bad.write_text((GH / "nightly.yml").read_text()
                   .replace("actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1  # v7.0.1", "actions/checkout@v4")
                   .replace('--branch "$DEFAULT_BRANCH"', '--branch "${{ github.event.pull_request.title }}"'))
    out = _zizmor(bad)
    assert out.returncode != 0
    found = {f["ident"] for f in json.loads(out.stdout)}
    assert {"unpinned-uses", "template-injection"} <= found
