"""The CLI reference page, written from the argparse parsers themselves.

Flags and defaults are declared once, in the command modules; a hand-kept list would drift
from them. `python -m k2bench.harness.clidoc > docs/reference/cli.md` regenerates the page,
and tests/docs/test_docs_cli_reference.py fails when the committed copy differs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from k2bench.harness.cli import build_parser

REGENERATE = "python -m k2bench.harness.clidoc > docs/reference/cli.md"
# Fixed so the page does not depend on the terminal it was generated in.
USAGE_WIDTH = 100

_HEADER = f"""# CLI reference

<!-- Generated from the argparse parsers; do not edit by hand. Regenerate with:
     {REGENERATE} -->

Every command, flag, default and choice below is read from the parsers that `k2bench` itself
uses, so this page and `k2bench COMMAND --help` say the same thing. Errors a user can act on are
one line on stderr and a non-zero exit: 2 for bad input, 3 for a server that failed or misbehaved.
"""


def _escape(text: str) -> str:
    """Markdown for one table cell or paragraph: no raw HTML, no accidental emphasis or column."""
    text = " ".join(text.split())
    for char, repl in (("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*")):
        text = text.replace(char, repl)
    return text


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line summary, parser) of each subcommand, in the order --help lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, summaries.get(name, ""), sub


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{names}`"
    metavar = action.metavar or action.dest.upper()
    return f"`{names} {metavar}`"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, []):
        return ""
    return f"`{action.default}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = ""
    if action.help and action.help != argparse.SUPPRESS:
        text = argparse.HelpFormatter(parser.prog)._expand_help(action)
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        choices = ", ".join(f"`{choice}`" for choice in action.choices)
        text = f"{_escape(text)} (one of {choices})" if text else f"one of {choices}"
        return text.strip()
    return _escape(text)


def _command(parser: argparse.ArgumentParser, summary: str, depth: int) -> list[str]:
    lines = [f"{'#' * depth} `{parser.prog}`", ""]
    if summary:
        lines += [_escape(summary[0].upper() + summary[1:]) + ".", ""]
    if parser.description:
        lines += [_escape(parser.description), ""]
    lines += ["```text", _usage(parser), "```", ""]
    lines += _arguments(parser)
    for _name, sub_summary, sub in _subparsers(parser):
        lines += _command(sub, sub_summary, depth + 1)
    return lines


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = [a for a in parser._actions
            if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]
    if not rows:
        return []
    lines = ["| argument | default | meaning |", "| --- | --- | --- |"]
    lines += [f"| {_flag(a)} | {_default(a)} | {_help(parser, a)} |" for a in rows]
    return [*lines, ""]


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole page as markdown."""
    parser = parser or build_parser()
    lines = [_HEADER]
    commands = list(_subparsers(parser))
    lines += ["| command | what it does |", "| --- | --- |"]
    lines += [f"| [`{name}`](#{_anchor(sub.prog)}) | {_escape(summary)} |" for name, summary, sub in commands]
    lines += ["", f"Options of `{parser.prog}` itself:", "", "```text", _usage(parser), "```", ""]
    lines += _arguments(parser)
    for _name, summary, sub in commands:
        lines += _command(sub, summary, 2)
    return "\n".join(lines).rstrip() + "\n"


def _anchor(prog: str) -> str:
    """The id mkdocs' toc extension gives a heading `prog` in backticks."""
    return "-".join(prog.lower().split())


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
