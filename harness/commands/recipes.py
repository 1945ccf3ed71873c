"""`k2bench recipes`: the engine recipes a sweep can launch (built-ins and the user's recipe files)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("recipes", help="list the engine recipes (built-in and user recipe files)",
                       description="Built-in recipes, then user recipe files (TOML, same fields; `extends` "
                                   "starts from another recipe) from --dir, $K2BENCH_RECIPES or ./recipes. "
                                   "Any other engine: sweep --server-cmd 'CMD with {port}'.")
    p.add_argument("--dir", default=None, help="folder of user recipe files (default: $K2BENCH_RECIPES, else "
                                               "./recipes when it exists)")
    p.add_argument("-v", "--verbose", action="store_true", help="also show each recipe's command and flags")
    p.set_defaults(handler=_recipes)


def _recipes(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from k2bench.harness import redact
    from k2bench.harness.servers import recipes

    known = recipes.all_recipes(args.dir)
    table = Table(title="engine recipes")
    for col in ("name", "from", "description", *(("command",) if args.verbose else ())):
        table.add_column(col, overflow="fold")
    for name in sorted(known):
        r = known[name]
        row = [name, str(r.source), r.description]  # user files' text: shown as written, never as markup
        if args.verbose:
            row.append(" ".join(redact.argv(r.argv + r.flags)))
        table.add_row(*(Text(cell) for cell in row))
    table.add_row(recipes.CUSTOM, "--server-cmd", "any server command with {port} (and {host} {model} {tp})",
                  *(("",) if args.verbose else ()))
    Console(width=160).print(table)
    return 0
