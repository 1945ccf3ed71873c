"""`k2bench engine tiny`: write the tiny Kimi-K2-shaped checkpoint the bundled engine runs on CPU.

A thin door: the engine (torch) is imported inside the handler only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


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
    t.add_argument("--layers", type=int, default=None, help="decoder layers, the first dense (default: the preset's, 4)")
    t.add_argument("--preset", default="tiny", choices=("tiny", "kimi-k2-width"),
                   help="tiny (CPU tests) or kimi-k2-width (Kimi-K2.5's full layer shapes: hidden 7168, "
                   "64 heads, 384 experts of 2048, top 8, vocab 163840; about 8.7 GB per MoE layer in MXFP4)")
    t.add_argument("--device", default="cpu", help="where weights are drawn and quantised (cuda is much faster "
                   "for kimi-k2-width)")
    t.add_argument("--task", default=None, choices=("tiny-arith",),
                   help="train the tiny model on this shipped task (CPU, a few minutes) before writing it, "
                   "instead of random weights; MXFP4 only")
    t.add_argument("--steps", type=int, default=None, help="training steps with --task (default: the trainer's)")
    t.add_argument("--reuse", action="store_true",
                   help="with --task: treat DIR as a cache, kept when it holds a model trained with the same "
                   "trainer version, settings and data, else trained again and replaced whole")
    t.set_defaults(handler=run_tiny)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def run_tiny(args: argparse.Namespace) -> int:
    from k2bench.errors import UserError

    if args.layers is not None and args.layers < 1:
        raise UserError(f"--layers must be at least 1, not {args.layers}")
    if args.task is not None:
        return _train(args)
    if args.steps is not None or args.reuse:
        raise UserError("--steps and --reuse only apply with --task")
    try:
        from k2bench.engine.model.tiny import write_tiny_checkpoint
    except ImportError as exc:
        raise UserError(f"the bundled engine needs its extra: pip install 'k2bench[engine]' ({exc})") from exc
    from dataclasses import replace

    import torch

    from k2bench.engine.model.tiny import PRESETS

    try:
        if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"--device {args.device}: no CUDA device is visible here")
    except RuntimeError as exc:
        raise UserError(f"--device {args.device!r} is not a torch device (cpu, cuda, cuda:1, ...)") from exc
    spec = PRESETS[args.preset]
    if args.layers is not None:
        spec = replace(spec, layers=args.layers)
    try:
        out = write_tiny_checkpoint(args.out, quant=args.quant, seed=args.seed, spec=spec, device=args.device,
                                    log=lambda msg: print(msg, flush=True) if args.preset != "tiny" else None)
    except OSError as exc:
        raise UserError(f"cannot write {args.out}: {exc}") from exc
    print(f"wrote tiny {args.quant} checkpoint to {out}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from k2bench.errors import UserError

    if args.quant != "mxfp4" or args.preset != "tiny" or args.device != "cpu":
        raise UserError("--task trains the tiny preset on CPU and writes MXFP4 (drop --quant/--preset/--device)")
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be at least 1, not {args.steps}")
    try:
        import transformers  # noqa: F401  (the trained model is HF's DeepseekV3ForCausalLM)

        from k2bench.engine.model.train_tiny import TrainSpec, cached_model, train_tiny
    except ImportError as exc:
        raise UserError(f"training needs the engine extra (torch and transformers): pip install 'k2bench[engine]' "
                        f"({exc})") from exc
    from dataclasses import replace

    spec = TrainSpec(seed=args.seed)
    if args.steps is not None:
        spec = replace(spec, steps=args.steps)
    if args.layers is not None:
        spec = replace(spec, layers=args.layers)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    try:
        if args.reuse:
            out, trained = cached_model(args.out, args.task, spec, log)
            if not trained:
                print(f"reusing the trained {args.task} model in {out}")
                return 0
        else:
            train_tiny(args.out, args.task, spec, log)
    except OSError as exc:
        raise UserError(f"cannot write {args.out}: {exc}") from exc
    summary = json.loads((Path(args.out) / "training.json").read_text())
    print(f"trained on {args.task} in {summary['train_seconds']} s: held-out exact match "
          f"{summary['held_out_exact_match_qat']:.3f} (A4W4 numerics, before export); wrote MXFP4 checkpoint to {args.out}")
    return 0
