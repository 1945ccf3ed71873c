"""The git side of backfill and bisect: commit ranges, and a throwaway worktree per commit."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from k2bench.errors import UserError


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    date: str  # author date, ISO 8601

    @property
    def short(self) -> str:
        return self.sha[:12]


def git(repo: str | Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise UserError(f"cannot run git: {exc.strerror or exc}") from None
    if out.returncode != 0:
        detail = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        raise UserError(f"git {' '.join(args)} in {repo}: {detail}")
    return out.stdout


def check_repo(repo: str | Path) -> Path:
    path = Path(repo)
    if not path.is_dir():
        raise UserError(f"--repo {repo}: no such folder")
    git(path, "rev-parse", "--git-dir")
    return path.resolve()


_FORMAT = "%H%x1f%s%x1f%aI"


def _parse(lines: str) -> list[Commit]:
    out = []
    for line in lines.splitlines():
        if line.strip():
            sha, subject, date = line.split("\x1f", 2)
            out.append(Commit(sha, subject, date))
    return out


def commits(repo: Path, rev_range: str, every: int = 1) -> list[Commit]:
    """Commits of ``rev_range`` (as git rev-list reads it) oldest first; every Nth, always the newest."""
    if every < 1:
        raise UserError("--every must be at least 1")
    found = _parse(git(repo, "log", "--reverse", f"--format={_FORMAT}", rev_range, "--"))
    if not found:
        raise UserError(f"{rev_range!r} holds no commit in {repo}")
    picked = found[::every]
    if picked[-1] != found[-1]:
        picked.append(found[-1])
    return picked


def resolve(repo: Path, rev: str) -> Commit:
    return _parse(git(repo, "log", "-1", f"--format={_FORMAT}", f"{rev}^{{commit}}", "--"))[0]


def path_between(repo: Path, good: Commit, bad: Commit) -> list[Commit]:
    """good, then every commit on an ancestry path from good to bad, oldest first (bad last)."""
    if not is_ancestor(repo, good.sha, bad.sha):
        raise UserError(f"--good {good.short} is not an ancestor of --bad {bad.short}")
    inner = _parse(git(repo, "log", "--reverse", "--ancestry-path", f"--format={_FORMAT}",
                       f"{good.sha}..{bad.sha}", "--"))
    return [good, *inner]


def is_ancestor(repo: Path, a: str, b: str) -> bool:
    out = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", a, b], capture_output=True)
    return out.returncode == 0


def branch_of(repo: Path, sha: str) -> str | None:
    """The repo's checked-out branch if it holds the commit, else the first local branch that does."""
    head = git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    holding = git(repo, "branch", "--contains", sha, "--format=%(refname:short)").split()
    if head in holding:
        return head
    return holding[0] if holding else None


@contextlib.contextmanager
def worktree(repo: Path, sha: str) -> Iterator[Path]:
    """A detached worktree of ``sha`` in a temporary folder, removed afterwards whatever happens."""
    parent = Path(tempfile.mkdtemp(prefix="k2bench-wt-"))
    path = parent / sha[:12]
    git(repo, "worktree", "add", "--detach", "--force", str(path), sha)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)
