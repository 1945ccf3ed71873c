"""`k2bench dashboard`: run the Streamlit app on a database (read-only)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from k2bench.harness.commands.common import add_db_arg

DEFAULT_PORT = 8501
DEFAULT_HOST = "127.0.0.1"


def register(sub) -> None:
    p = sub.add_parser("dashboard", help="browse frontiers, history and comparisons in a web dashboard",
                       description="Start the Streamlit dashboard on a k2bench database (it only reads).")
    add_db_arg(p)
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to bind (default {DEFAULT_HOST}; 0.0.0.0 to share on the network)")
    p.set_defaults(handler=run)


def app_path() -> Path:
    return Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


def streamlit_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start the app; the URL travels in K2BENCH_DB."""
    from k2bench.errors import UserError

    if not 0 < args.port < 65536:
        raise UserError(f"--port must be between 1 and 65535, not {args.port}")
    if importlib.util.find_spec("streamlit") is None:
        raise UserError("the dashboard needs Streamlit: pip install 'k2bench[dashboard]' (or -e '.[dashboard]')")
    app = app_path()
    if not app.is_file():
        raise UserError(f"dashboard app not found at {app} (is k2bench installed from a checkout?)")
    env = dict(os.environ)
    if args.db:
        env["K2BENCH_DB"] = args.db
    env.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
    argv = [sys.executable, "-m", "streamlit", "run", str(app),
            "--server.port", str(args.port), "--server.address", args.host,
            "--server.headless", "true", "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    return argv, env


def run(args: argparse.Namespace) -> int:
    argv, env = streamlit_command(args)
    print(f"k2bench dashboard on http://{args.host}:{args.port} (Ctrl-C to stop)", file=sys.stderr)
    os.execvpe(argv[0], argv, env)
    return 0  # not reached
