"""Provenance: what a run records about the code and software that produced it."""

from __future__ import annotations

import subprocess
import sys

from k2bench import __version__
from k2bench.harness.record import provenance


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_git_facts_of_a_checkout(tmp_path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "feature")
    (repo / "a.txt").write_text("1\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "one")
    sha = _git(repo, "rev-parse", "HEAD")
    r = str(repo)
    assert provenance.git_commit(r) == sha and provenance.git_branch(r) == "feature"
    assert provenance.git_dirty(r) is False
    (repo / "untracked.txt").write_text("not part of the commit's files\n")
    assert provenance.git_dirty(r) is False  # untracked files do not change the measured code
    (repo / "a.txt").write_text("2\n")
    assert provenance.git_dirty(r) is True
    _git(repo, "checkout", "-q", "--detach")
    assert provenance.git_branch(r) is None  # detached HEAD: no branch to record
    assert provenance.git(r, "rev-parse", "no-such-revision") is None


def test_outside_a_checkout_everything_is_unknown(tmp_path) -> None:
    r = str(tmp_path)
    assert provenance.git_commit(r) is None and provenance.git_branch(r) is None
    assert provenance.git_dirty(r) is None


def test_versions_come_from_metadata_without_importing_torch() -> None:
    code = ("import sys; from k2bench.harness.record import provenance; v = provenance.versions(); "
            "assert 'torch' not in sys.modules; print(v['k2bench'], v['python'], v['aiohttp'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    k2, py, aiohttp_version = out.stdout.split()
    import aiohttp

    assert k2 == __version__ and py == sys.version.split()[0] and aiohttp_version == aiohttp.__version__

