"""`k2bench eval`: accuracy of a running server on a local task, through lm-evaluation-harness.

A thin door: lm-eval is imported inside the handler only, so the CLI starts without it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from k2bench.errors import UserError


def register(sub) -> None:
    p = sub.add_parser(
        "eval", help="accuracy of a server on a local task (lm-evaluation-harness)",
        description="Run an lm-evaluation-harness task against an OpenAI-compatible server's /v1/completions "
        "(greedy, task data from local files only) and report its exact-match accuracy with standard error.",
    )
    p.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--task", help="task name (see --list)")
    p.add_argument("--list", action="store_true", help="list the tasks and exit")
    p.add_argument("--data", metavar="PATH", help="JSONL of {question, answer} items (GSM8K format); "
                   "required by gsm8k, replaces the shipped items of tiny-arith")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N items")
    p.add_argument("--concurrency", type=int, default=8, metavar="C", help="requests in flight (default 8)")
    p.add_argument("--model", default=None, help="model name sent with each request (default: the server's first)")
    p.add_argument("--json", metavar="PATH", help="write the result as a k2bench.eval/1 JSON document")
    p.add_argument("--min-accuracy", type=float, default=None, metavar="X",
                   help="exit 1 when the accuracy is below X (0..1)")
    p.set_defaults(handler=run)


def _list() -> int:
    from k2bench.harness.eval.tasks import TASKS

    for info in TASKS.values():
        print(f"{info.name:12s} {info.description}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list()
    if not args.url or not args.task:
        raise UserError("k2bench eval needs --url and --task (or --list)")
    if args.min_accuracy is not None and not 0.0 <= args.min_accuracy <= 1.0:
        raise UserError(f"--min-accuracy must be within 0..1, not {args.min_accuracy}")
    from k2bench.harness.eval.runner import run_eval

    result = run_eval(args.url, args.task, limit=args.limit, concurrency=args.concurrency, data=args.data,
                      model=args.model)
    stderr = f" ± {result.stderr:.4f}" if result.stderr is not None else ""
    print(f"{result.task}  {result.metric} = {result.value:.4f}{stderr}  (n={result.n}, "
          f"model {result.model}, server {result.server}, concurrency {result.concurrency})")
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(result.to_json(), indent=2) + "\n")
        except OSError as exc:
            raise UserError(f"cannot write {args.json}: {exc}") from exc
    if args.min_accuracy is not None and result.value < args.min_accuracy:
        print(f"accuracy {result.value:.4f} is below --min-accuracy {args.min_accuracy}")
        return 1
    return 0
