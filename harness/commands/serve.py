"""`k2bench serve`: the bundled engine as an OpenAI-compatible server (engine imported lazily)."""

from __future__ import annotations

import argparse
import os
import sys

from k2bench.errors import UserError
from k2bench.harness.plan.settings import API_KEY_ENV

DEFAULT_PORT = 8000


def register(sub: argparse._SubParsersAction) -> None:
    # The engine's own defaults and names, from its torch-free modules (imported here, not at module
    # level: this is the one door from the CLI into the engine), so --help shows the real values.
    from k2bench.engine.kernels import backend_names
    from k2bench.engine.runtime.runtime_config import ALL_REDUCE_MODES, KV_CACHE_DTYPES, RuntimeConfig
    from k2bench.engine.runtime.server_limits import ServerLimits
    from k2bench.engine.runtime.server_process import ProcessSettings

    rt = RuntimeConfig()
    lim = ServerLimits()
    proc = ProcessSettings()
    p = sub.add_parser("serve", help="serve a Kimi-K2 / DeepSeek-V3 checkpoint with the bundled engine",
                       description="Serve a checkpoint folder with the bundled MXFP4 engine over an "
                                   "OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /metrics).")
    p.add_argument("--model", required=True, help="checkpoint folder (config.json, safetensors, tokenizer.json)")
    p.add_argument("--served-model-name", default=None, help="model id in the API (default: the folder name)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' (default: env {API_KEY_ENV}, which other users "
                        "of the machine cannot read from the process list; none: no key)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks, one process each (default 1)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the model runs: auto, cpu or cuda (default auto: cuda when visible)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="activation and float-weight dtype: auto, float32 or bfloat16 (default auto: the "
                        "checkpoint's)")
    p.add_argument("--quant-mode", default="auto", choices=("auto", "w4", "a4w4"),
                   help="MXFP4 numerics: auto, w4 or a4w4 (default auto: a4w4 if the checkpoint declares fp4 "
                        "inputs, else w4)")
    backends = backend_names()
    p.add_argument("--backend", default="auto", choices=backends,
                   help=f"kernel backend: {', '.join(backends)} (default auto: triton on CUDA, else torch)")
    g = p.add_argument_group("runtime")
    g.add_argument("--max-num-seqs", type=int, default=None,
                   help=f"most sequences in one batch (default {rt.max_num_seqs})")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help=f"token budget of one step (default {rt.max_num_batched_tokens})")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="prompt + output limit (default: the model's max_position_embeddings)")
    g.add_argument("--block-size", type=int, default=None,
                   help=f"tokens per KV cache block (default {rt.block_size})")
    kv = g.add_mutually_exclusive_group()
    kv.add_argument("--num-kv-blocks", type=int, default=None,
                    help="KV cache size in blocks (default: from --kv-cache-memory, else room for "
                         "--max-num-seqs sequences of --max-model-len)")
    kv.add_argument("--kv-cache-memory", type=float, default=None,
                    help="KV cache size in GiB per rank (default: see --num-kv-blocks)")
    g.add_argument("--kv-cache-dtype", default=None, choices=KV_CACHE_DTYPES,
                   help=f"KV cache storage: {', '.join(KV_CACHE_DTYPES)} (default {rt.kv_cache_dtype}: bfloat16 "
                        "for bf16 models, else the model dtype; fp8 = float8_e4m3fn, upcast on read)")
    g.add_argument("--enforce-eager", dest="cuda_graphs", action="store_const", const=False, default=None,
                   help="never replay CUDA graphs of decode steps (default: on CUDA with the triton backend "
                        "they are captured at start-up for batch sizes up to --max-num-seqs)")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="launch the next decode step before this one's tokens are read, so that scheduling and "
                        "input building run while the device computes (default "
                        f"{'on' if rt.async_scheduling else 'off'}; off under --tp > 1)")
    g.add_argument("--all-reduce", default=None, choices=ALL_REDUCE_MODES,
                   help="tensor-parallel sum: auto (one-shot over CUDA symmetric memory for tensors up to "
                        "--one-shot-max-bytes, NCCL above; NCCL alone, with one log line, where one-shot cannot "
                        "run or its start-up check disagrees with NCCL), nccl (always), one-shot (as auto, but "
                        f"start-up fails where one-shot cannot run) (default {rt.all_reduce})")
    g.add_argument("--one-shot-max-bytes", type=int, default=None,
                   help=f"largest tensor the one-shot all-reduce takes (default {rt.one_shot_max_bytes}: "
                        "room for 32 tokens of hidden 7168 in bf16)")
    g.add_argument("--scheduler-delay-factor", type=float, default=None,
                   help="admit new prefills only after the oldest waited factor x the last prefill step "
                        f"(default {rt.scheduler_delay_factor:g}: no delay)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse the KV blocks of a prompt prefix an earlier request computed (automatic prefix "
                        f"caching; default {'on' if rt.enable_prefix_caching else 'off'}, as the recipes run "
                        "vLLM and SGLang, so a repeated prompt is not free unless asked for)")
    h = p.add_argument_group("limits")
    h.add_argument("--request-timeout", type=float, default=None,
                   help="seconds a client has to send a whole request (head and body), counted from the "
                        "connection's opening or the end of its previous request; idle connections are closed "
                        f"after it too (default {lim.request_timeout:g})")
    h.add_argument("--max-connections", type=int, default=None,
                   help=f"open connections at once; more get a 503 (default {lim.max_connections})")
    h.add_argument("--max-request-bytes", type=int, default=None,
                   help="largest request body, else a 413 (default: what the longest prompt --max-model-len "
                        "allows could take as JSON, plus 1 MiB)")
    i = p.add_argument_group("interpreter")
    i.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=None,
                   help="once warmed up, keep the start-up heap out of later garbage collections, whose "
                        f"pauses stop every stream (gc.freeze; default {'on' if proc.gc_freeze else 'off'})")
    p.set_defaults(handler=run)


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The line `k2bench serve` prints when it listens beyond this machine with no key (never the key)."""
    import ipaddress

    if api_key:
        return None
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        local = False
    if local:
        return None
    return (f"k2bench serve: warning: listening on {host} without an API key: anyone who can reach this port can "
            f"use the model (set {API_KEY_ENV} or --api-key)")


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
    from k2bench.engine.runtime.server import EngineFailed, serve
    from k2bench.engine.runtime.server_limits import ServerLimits
    from k2bench.engine.runtime.server_process import ProcessSettings, Stalls
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
    limits = ServerLimits()
    for f in fields(ServerLimits):
        v = getattr(args, f.name, None)
        if v is not None:
            setattr(limits, f.name, v)
    process = ProcessSettings()
    for f in fields(ProcessSettings):
        v = getattr(args, f.name, None)
        if v is not None:
            setattr(process, f.name, v)
    try:
        rt.validate()
        limits.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    logging.getLogger("k2bench.engine").setLevel(logging.INFO)
    stalls = Stalls().install()  # before the engine: start-up's collections and compiles are counted too
    opts = EngineOptions(model=str(model), device=args.device, dtype=args.dtype, quant_mode=args.quant_mode,
                         backend=args.backend, tp=args.tp, runtime=rt)
    try:
        tok = Tokenizer(model) if (model / "tokenizer.json").is_file() else None
        engine = build_engine(opts)
    except (EngineConfigError, TokenizerError) as exc:
        raise UserError(str(exc)) from None
    name = args.served_model_name or model.resolve().name
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    warning = exposure_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        await serve(engine, tok, host=args.host, port=args.port, served_name=name, api_key=api_key,
                    root=str(model.resolve()), limits=limits, on_ready=lambda: process.warmed(stalls),
                    stalls=stalls)

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        pass
    except EngineFailed as exc:
        print(f"k2bench serve: {exc}; the tensor-parallel ranks may be out of step, so the server stops",
              file=sys.stderr, flush=True)
        if engine.comm is not None:
            engine.comm.shutdown_hard()  # a worker may sit in a collective rank 0 will never join
        return 3
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    finally:
        engine.shutdown()
    return 0
