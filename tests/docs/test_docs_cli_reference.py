"""The CLI reference page is generated from the parsers; these tests keep the committed copy honest."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from k2bench.harness import clidoc
from k2bench.harness.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "cli.md"


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((*prefix, name))
                found += _commands(sub, (*prefix, name))
    return found


def test_committed_page_matches_the_parsers() -> None:
    committed = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    assert committed == clidoc.render(), (
        f"{PAGE.relative_to(ROOT)} is stale; regenerate it with:\n    {clidoc.REGENERATE}")


def test_every_flag_that_help_prints_is_on_the_page() -> None:
    """Checked against `k2bench ... --help` itself, not against the generator's own walk."""
    page = PAGE.read_text(encoding="utf-8")
    commands = _commands(build_parser())
    assert ("sweep",) in commands and ("engine", "tiny") in commands
    for command in commands:
        out = subprocess.run([sys.executable, "-m", "k2bench.harness.cli", *command, "--help"],
                             capture_output=True, text=True, check=True).stdout
        # option lines of the help: "  --flag ...", "  -v, --verbose ..."
        flags = set(re.findall(r"^ {2}(?:-\w, )?(--[a-z][a-z0-9-]*)", out, re.MULTILINE)) - {"--help"}
        # a command that only groups subcommands (engine, suite) has no flags of its own
        assert flags or any(c[:-1] == command for c in commands), f"no flags parsed from {command} --help"
        heading = f"`k2bench {' '.join(command)}`"
        assert heading in page, f"{heading} has no section"
        section = page.split(heading, 1)[1].split("\n## ", 1)[0]
        missing = sorted(flag for flag in flags if f"`{flag}" not in section and f", {flag}" not in section)
        assert not missing, f"{heading}: flags in --help but not on the page: {missing}"


def test_help_text_cannot_break_the_markdown() -> None:
    parser = argparse.ArgumentParser(prog="k2bench demo")
    parser.add_argument("--out", help="writes <stem>.png | and *this*")
    parser.add_argument("--mode", choices=["a", "b"], default="a")
    page = clidoc.render(parser)
    row = next(line for line in page.splitlines() if line.startswith("| `--out"))
    assert "&lt;stem&gt;.png \\| and \\*this\\*" in row
    assert row.count(" | ") == 2  # three cells, the pipe in the help escaped
    mode = next(line for line in page.splitlines() if line.startswith("| `--mode"))
    assert "`a`" in mode and "one of `a`, `b`" in mode
