"""The `k2bench` command line. Subcommands live in k2bench.harness.commands.<module>."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from k2bench import __version__
from k2bench.errors import UserError

# Order is the order shown in --help. Each module registers its own subcommands.
COMMAND_MODULES = (
    "sweep",  # k2bench sweep
    "runs",  # k2bench runs / show / export / import
    "regress",  # k2bench regress / changepoints
    "dashboard",  # k2bench dashboard
    "serve",  # k2bench serve (thin door into k2bench.engine, imported lazily)
    "engine",  # k2bench engine tiny (writes the tiny checkpoint; engine imported lazily)
    "eval",  # k2bench eval (lm-evaluation-harness against a server, imported lazily)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="k2bench",
        description="Continuous benchmarking for LLM serving: sweep, store, compare, watch.",
    )
    parser.add_argument("--version", action="version", version=f"k2bench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"k2bench.harness.commands.{name}")
        except ModuleNotFoundError as exc:  # a command group not built yet must not break the others
            if exc.name != f"k2bench.harness.commands.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
        print(f"k2bench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("k2bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
