"""Assemble a ready engine from a model folder and runtime settings (one process or N TP ranks)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from k2bench.engine.runtime.block_manager import BlockManager, blocks_for
from k2bench.engine.runtime.engine import LLMEngine
from k2bench.engine.runtime.runner import KV_CODES, kv_block_bytes, kv_torch_dtype, make_runner
from k2bench.engine.runtime.runtime_config import EngineConfigError, RuntimeConfig
from k2bench.engine.runtime.scheduler import Scheduler
from k2bench.net import free_port

log = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda")
CPU_KV_CAP = 2 << 30  # default KV cache bytes on CPU (all ranks together), unless asked otherwise


@dataclass
class EngineOptions:
    model: str
    device: str = "auto"
    dtype: str = "auto"
    quant_mode: str = "auto"
    backend: str = "auto"
    tp: int = 1
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)


def resolve_device(device: str, tp: int) -> str:
    if device not in DEVICES:
        raise EngineConfigError(f"--device must be one of {', '.join(DEVICES)} (got {device})")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        n = torch.cuda.device_count()
        if n < tp:
            raise EngineConfigError(f"--tp {tp} needs {tp} CUDA devices; this machine has {n}")
    return device


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def size_kv_cache(rt: RuntimeConfig, cfg, kv_dtype: torch.dtype, max_model_len: int, device: str, tp: int) -> int:
    """Number of KV blocks: as asked, or enough for max_num_seqs full sequences within a memory cap."""
    per_block = kv_block_bytes(cfg.num_hidden_layers, rt.block_size, cfg.kv_cache_dim, kv_dtype)
    per_seq = blocks_for(max_model_len, rt.block_size)
    if rt.num_kv_blocks is not None:
        n = rt.num_kv_blocks
    elif rt.kv_cache_memory is not None:
        n = int(rt.kv_cache_memory * (1 << 30) // per_block)
    else:
        if device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info()
            cap = int(free * 0.85)
        else:
            # Every rank holds the whole latent cache; leave the machine usable for everything else.
            cap = min(int(_mem_available() * 0.2), CPU_KV_CAP) // tp
        n = min(rt.max_num_seqs * per_seq, cap // per_block)
    if n < per_seq:
        raise EngineConfigError(
            f"the KV cache ({n} blocks of {rt.block_size} tokens) cannot hold one sequence of max_model_len "
            f"{max_model_len}; lower --max-model-len or give more --num-kv-blocks / --kv-cache-memory")
    return n


def build_engine(opts: EngineOptions) -> LLMEngine:
    from k2bench.engine.model.loader import load_model, resolve_dtype
    from k2bench.engine.runtime import distributed

    rt = opts.runtime
    rt.validate()
    if opts.tp < 1:
        raise EngineConfigError(f"--tp must be >= 1 (got {opts.tp})")
    device = resolve_device(opts.device, opts.tp)
    if opts.tp > 1 or device != "cpu":  # a one-process CPU engine keeps torch's default (every core)
        distributed.set_host_threads(device, opts.tp)
    workers = None
    if opts.tp > 1:
        port = free_port()
        spec = {"model": str(opts.model), "device": device, "dtype": opts.dtype, "quant_mode": opts.quant_mode,
                "backend": opts.backend, "all_reduce": rt.all_reduce, "one_shot_max_bytes": rt.one_shot_max_bytes}
        workers = distributed.Workers(spec, opts.tp, port, device)
        distributed.init_group(0, opts.tp, port, device)
    rank_dev = distributed.rank_device(device, 0)
    try:
        model, cfg = load_model(opts.model, device=rank_dev, dtype=opts.dtype, quant_mode=opts.quant_mode,
                                backend=opts.backend, tp_rank=0, tp_size=opts.tp)
        max_model_len = rt.max_model_len or cfg.max_position_embeddings
        if max_model_len > cfg.max_position_embeddings:
            raise EngineConfigError(f"--max-model-len {max_model_len} exceeds the model's max_position_embeddings "
                                    f"{cfg.max_position_embeddings}")
        rt.max_model_len = max_model_len
        kv_dtype = kv_torch_dtype(rt.kv_cache_dtype, resolve_dtype(opts.dtype, cfg))
        num_blocks = size_kv_cache(rt, cfg, kv_dtype, max_model_len, rank_dev, opts.tp)
    except BaseException:
        if workers is not None:
            workers.shutdown_hard()
        raise
    if workers is not None:
        workers.broadcast_ints([num_blocks, rt.block_size, max_model_len, rt.max_num_seqs, KV_CODES[kv_dtype],
                                int(rt.cuda_graphs), rt.warm_up_ctx, rt.max_num_batched_tokens])
        try:
            distributed.setup_all_reduce(model, rt.all_reduce, rt.one_shot_max_bytes, rank_dev)
        except BaseException:
            workers.shutdown_hard()
            raise
    runner = make_runner(model, cfg, num_blocks=num_blocks, block_size=rt.block_size, kv_code=KV_CODES[kv_dtype],
                         max_model_len=max_model_len, max_rows=rt.max_num_seqs, device=rank_dev,
                         cuda_graphs=rt.cuda_graphs)
    eos = getattr(cfg, "eos_token_ids", None) or cfg.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    sched = Scheduler(rt, BlockManager(num_blocks, rt.block_size, enable_caching=rt.enable_prefix_caching), eos_token_ids=eos_ids)
    log.info("engine ready: %s, tp %d, %d KV blocks of %d (%s), max_model_len %d, %s, prefix caching %s, pid %d",
             device, opts.tp, num_blocks, rt.block_size, kv_dtype, max_model_len,
             "decode CUDA graphs" if runner.graphs is not None else "eager",
             "on" if rt.enable_prefix_caching else "off", os.getpid())
    engine = LLMEngine(runner, sched, comm=workers)
    engine.model_config = cfg
    return engine
