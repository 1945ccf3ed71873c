"""The GitHub Actions templates pass actionlint (from the dev extra), with the suites' runner labels."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from k2bench.harness import suites

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
    assert {f.name for f in files} >= {"nightly.yml", "pr.yml"}
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
