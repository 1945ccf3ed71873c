"""`k2bench serve`: the bundled engine as an OpenAI-compatible server (engine imported lazily)."""

from __future__ import annotations

import argparse
import os

from k2bench.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a Kimi-K2 / DeepSeek-V3 checkpoint with the bundled engine",
                       description="Serve a checkpoint folder with the bundled MXFP4 engine over an "
                                   "OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /metrics).")
    p.add_argument("--model", required=True, help="checkpoint folder (config.json, safetensors, tokenizer.json)")
    p.add_argument("--served-model-name", default=None, help="model id in the API (default: the folder name)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or K2BENCH_API_KEY)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks, one process each")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="activation and float-weight dtype (auto: the checkpoint's)")
    p.add_argument("--quant-mode", default="auto", choices=("auto", "w4", "a4w4"),
                   help="MXFP4 numerics (auto: a4w4 if the checkpoint declares fp4 inputs, else w4)")
    p.add_argument("--backend", default="auto", help="kernel backend (auto picks per device)")
    g = p.add_argument_group("runtime (defaults in k2bench.engine.runtime.runtime_config)")
    g.add_argument("--max-num-seqs", type=int, default=None, help="most sequences in one batch")
    g.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget of one step")
    g.add_argument("--max-model-len", type=int, default=None, help="prompt + output limit (default: the model's)")
    g.add_argument("--block-size", type=int, default=None, help="tokens per KV cache block")
    kv = g.add_mutually_exclusive_group()
    kv.add_argument("--num-kv-blocks", type=int, default=None, help="KV cache size in blocks")
    kv.add_argument("--kv-cache-memory", type=float, default=None, help="KV cache size in GiB per rank")
    g.add_argument("--kv-cache-dtype", default=None, choices=("auto", "bfloat16", "fp8"),
                   help="KV cache storage (fp8 = float8_e4m3fn, upcast on read)")
    g.add_argument("--enforce-eager", dest="cuda_graphs", action="store_const", const=False, default=None,
                   help="never replay CUDA graphs of decode steps (on CUDA with the triton backend they are "
                        "captured at start-up for batch sizes up to --max-num-seqs)")
    g.add_argument("--scheduler-delay-factor", type=float, default=None,
                   help="admit new prefills only after the oldest waited factor x the last prefill step")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal
    from dataclasses import fields
    from pathlib import Path

    try:
        import torch  # noqa: F401
    except ImportError:
        raise UserError("k2bench serve needs the engine extra: pip install -e '.[engine]'") from None
    from k2bench.engine.runtime.build import EngineConfigError, EngineOptions, build_engine
    from k2bench.engine.runtime.runtime_config import RuntimeConfig
    from k2bench.engine.runtime.server import serve
    from k2bench.engine.runtime.tokenizer import Tokenizer, TokenizerError

    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise UserError(f"--model {model}: no config.json there (is it a Hugging Face checkpoint folder?)")
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be 1..65535 (got {args.port})")
    rt = RuntimeConfig()
    for f in fields(RuntimeConfig):
        v = getattr(args, f.name, None)
        if v is not None:
            setattr(rt, f.name, v)
    try:
        rt.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    logging.getLogger("k2bench.engine").setLevel(logging.INFO)
    opts = EngineOptions(model=str(model), device=args.device, dtype=args.dtype, quant_mode=args.quant_mode,
                         backend=args.backend, tp=args.tp, runtime=rt)
    try:
        tok = Tokenizer(model) if (model / "tokenizer.json").is_file() else None
        engine = build_engine(opts)
    except (EngineConfigError, TokenizerError) as exc:
        raise UserError(str(exc)) from None
    name = args.served_model_name or model.resolve().name
    api_key = args.api_key or os.environ.get("K2BENCH_API_KEY") or None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        await serve(engine, tok, host=args.host, port=args.port, served_name=name, api_key=api_key)

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        pass
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    finally:
        engine.shutdown()
    return 0
