"""`k2bench engine tiny`: write the tiny Kimi-K2-shaped checkpoint the bundled engine runs on CPU.

A thin door: the engine (torch) is imported inside the handler only.
"""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("engine", help="bundled-engine utilities (tiny checkpoint generator)",
                       description="Utilities of the bundled MXFP4 engine.")
    esub = p.add_subparsers(dest="engine_command", metavar="SUBCOMMAND")
    t = esub.add_parser(
        "tiny",
        help="write a tiny Kimi-K2-shaped checkpoint (bf16 or Quark MXFP4) with a tokenizer",
        description="Write a tiny DeepSeek-V3/Kimi-K2-shaped checkpoint in the real file format "
        "(safetensors shards + index, config.json, tokenizer.json) for CPU runs and tests.",
    )
    t.add_argument("--out", required=True, metavar="DIR", help="output folder (created; files are overwritten)")
    t.add_argument("--quant", choices=("mxfp4", "bf16"), default="mxfp4", help="weight format (default mxfp4)")
    t.add_argument("--seed", type=int, default=0, help="random seed of the weights (default 0)")
    t.add_argument("--layers", type=int, default=None, help="decoder layers, the first dense (default 4)")
    t.set_defaults(handler=run_tiny)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def run_tiny(args: argparse.Namespace) -> int:
    from k2bench.harness.errors import UserError

    if args.layers is not None and args.layers < 1:
        raise UserError(f"--layers must be at least 1, not {args.layers}")
    try:
        from k2bench.engine.tiny import TinySpec, write_tiny_checkpoint
    except ImportError as exc:
        raise UserError(f"the bundled engine needs its extra: pip install 'k2bench[engine]' ({exc})") from exc
    spec = TinySpec() if args.layers is None else TinySpec(layers=args.layers)
    try:
        out = write_tiny_checkpoint(args.out, quant=args.quant, seed=args.seed, spec=spec)
    except OSError as exc:
        raise UserError(f"cannot write {args.out}: {exc}") from exc
    print(f"wrote tiny {args.quant} checkpoint to {out}")
    return 0
