"""What every command shares: the `--db` argument and its help, and the console tables print to.

Not a command group itself (cli.COMMAND_MODULES does not list it). Cheap to import: rich is imported
only when a console is asked for.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

# the store's default (k2bench.harness.store.db.DEFAULT_DB_URL; a test keeps the two equal), spelt out
# here so that building the parser does not import SQLAlchemy
DEFAULT_DB_URL = "sqlite:///results/k2bench.db"
DB_HELP = f"database URL, SQLite or PostgreSQL (default: env K2BENCH_DB, else {DEFAULT_DB_URL})"
PIPE_WIDTH = 200  # columns of a table printed to a pipe or log


def add_db_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--db", default=None, metavar="URL", help=DB_HELP)


def table_console(stderr: bool = False) -> Console:
    """A rich console for tables: the terminal's width, or PIPE_WIDTH when output goes to a pipe or
    log file (rich would squeeze tables into 80 columns there)."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=PIPE_WIDTH)
    return console
