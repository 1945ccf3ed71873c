"""The `k2bench` command line. Subcommands live in k2bench.harness.commands.<module>.

Mistyped commands, choices and flags get a "did you mean" hint, so a user does not have to read the
whole usage to find `--conc` when they typed `--concurrency`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import sys
from collections.abc import Iterable, Sequence

from k2bench import __version__
from k2bench.errors import UserError
from k2bench.harness.crash import report_crash

# Order is the order shown in --help. Each module registers its own subcommands.
COMMAND_MODULES = (
    "sweep",  # k2bench sweep
    "capacity",  # k2bench capacity (the SLO capacity search)
    "recipes",  # k2bench recipes
    "suite",  # k2bench suite list|run|matrix|submit
    "history",  # k2bench backfill / bisect
    "runs",  # k2bench runs / show / export / import
    "regress",  # k2bench regress / changepoints
    "profile",  # k2bench profile-diff
    "db",  # k2bench db status|upgrade
    "dashboard",  # k2bench dashboard
    "serve",  # k2bench serve (thin door into k2bench.engine, imported lazily)
    "engine",  # k2bench engine tiny (writes the tiny checkpoint; engine imported lazily)
    "eval",  # k2bench eval (lm-evaluation-harness against a server, imported lazily)
)


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate the user most likely meant: one that ``word`` starts with (``--concurrency`` ->
    ``--conc``), the same letters in another order (``tyni`` -> ``tiny``), else the closest spelling;
    None when nothing is close."""
    options = sorted(set(candidates))
    prefixes = [c for c in options if word.startswith(c) and len(c) > 2]
    if prefixes:
        return max(prefixes, key=len)
    shuffled = [c for c in options if sorted(c) == sorted(word)]
    if shuffled:
        return shuffled[0]
    found = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return found[0] if found else None


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose invalid-choice errors suggest the closest choice (subcommands
    included: argparse gives every subparser its parent's class)."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            guess = closest(str(value), map(str, action.choices or ()))
            if guess is None:
                raise
            raise argparse.ArgumentError(action, f"{exc.message}; did you mean {guess!r}?") from None


def _leaf_parsers(parser: argparse.ArgumentParser) -> Iterable[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from _leaf_parsers(sub)


def build_parser() -> Parser:
    parser = Parser(
        prog="k2bench",
        description="Continuous benchmarking for LLM serving: sweep, store, compare, watch.",
    )
    parser.add_argument("--version", action="version", version=f"k2bench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"k2bench.harness.commands.{name}").register(sub)
    parser.set_defaults(parser_used=parser)
    for p in _leaf_parsers(parser):  # the deepest parser reached wins: it names the command in errors
        p.set_defaults(parser_used=p)
    return parser


def _reject_unknown(used: argparse.ArgumentParser, extras: Sequence[str]) -> None:
    """argparse's 'unrecognized arguments' error, from the command's own parser and with a hint."""
    flags = [s for a in used._actions for s in a.option_strings if s.startswith("--")]
    guesses = {}
    for token in extras:
        flag = token.split("=", 1)[0]
        guess = closest(flag, flags) if flag.startswith("-") else None
        if guess:
            guesses[flag] = guess
    if len(guesses) == 1:
        hint = f"; did you mean {next(iter(guesses.values()))}?"
    else:
        hint = "".join(f"; {flag}: did you mean {guess}?" for flag, guess in guesses.items())
    used.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extras = parser.parse_known_args(argv)
    args.argv = argv  # the command line as given, for the run's reproducible record
    if extras:
        _reject_unknown(args.parser_used, extras)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except UserError as exc:
        from k2bench.harness import redact

        print(f"k2bench: error: {redact.Secrets().add_argv(argv).scrub(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("k2bench: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: its own exit code, never 1 (1 is "a level was stored invalid")
        return report_crash(exc, verbose=args.verbose)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
