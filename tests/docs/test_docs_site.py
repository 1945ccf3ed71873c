"""The README stays a door and the docs site builds without a broken link."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_LIMIT = 8_000  # characters (issue 10): everything else belongs in docs/


def test_readme_is_short() -> None:
    size = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert size <= README_LIMIT, f"README.md has {size} characters; move detail into docs/ (limit {README_LIMIT})"


def test_readme_links_point_at_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)#\s]+)", readme) if "://" not in t]
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_changelog_keeps_a_place_for_new_entries_above_the_newest() -> None:
    text = (ROOT / "bench" / "results" / "CHANGELOG.md").read_text(encoding="utf-8")
    marker = text.index("<!-- NEW ENTRIES")
    first_entry = text.index("\n## ")
    assert marker < first_entry
    dates = re.findall(r"^## (\d{4}-\d{2}-\d{2})", text, re.MULTILINE)
    assert dates == sorted(dates, reverse=True), "entries must be newest first"
    for path in re.findall(r"`(bench/results/[^`*]+?)`", text):
        assert (ROOT / path).exists(), f"CHANGELOG.md names a result that is not there: {path}"


def test_mkdocs_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="the docs extra is not installed (pip install -e '.[docs]')")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text(encoding="utf-8")
    assert "Measurements changelog" in changelog  # the snippet from bench/results/ was included

