"""`load_model`: config.json + safetensors -> a ready model for one tensor-parallel rank.

The model is built on the meta device (no memory, no init), materialised with `to_empty` on the
target device (memory = this rank's share of the model, uninitialised), then every parameter is
filled from the checkpoint by strict loading, so peak memory stays near the model size.
"""

from __future__ import annotations

from pathlib import Path

import torch

from k2bench.engine.kernels import BackendError, get_backend
from k2bench.engine.model.checkpoint import CheckpointError, load_checkpoint
from k2bench.engine.model.config import ConfigError, ModelConfig, load_config
from k2bench.engine.model.deepseek import DeepseekV3ForCausalLM
from k2bench.engine.model.moe import DenseMLP, Experts
from k2bench.engine.model.parallel import Parallel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANT_MODES = ("auto", "w4", "a4w4")


def resolve_dtype(dtype: str | torch.dtype, cfg: ModelConfig) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = cfg.torch_dtype if dtype == "auto" else dtype
    if name not in DTYPES:
        raise ConfigError(f"dtype {name!r} not supported; valid: auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_quant_mode(quant_mode: str, cfg: ModelConfig) -> str:
    """'none' for float checkpoints; 'a4w4' / 'w4' for MXFP4 ones ('auto' follows input_tensors)."""
    if quant_mode not in QUANT_MODES:
        raise ConfigError(f"quant mode {quant_mode!r} not supported; valid: {', '.join(QUANT_MODES)}")
    if cfg.quant is None:
        if quant_mode != "auto":
            raise ConfigError(f"--quant-mode {quant_mode} needs an MXFP4 checkpoint; this one has no quantization_config")
        return "none"
    if quant_mode == "auto":
        return "a4w4" if cfg.quant.dynamic_input else "w4"
    return quant_mode


def load_model(
    model_dir: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "auto",
    quant_mode: str = "auto",
    backend: str = "auto",
    tp_rank: int = 0,
    tp_size: int = 1,
) -> tuple[DeepseekV3ForCausalLM, ModelConfig]:
    """Load the model for rank `tp_rank` of `tp_size`; torch.distributed must be initialised if tp_size > 1."""
    cfg = load_config(model_dir)
    torch_dtype = resolve_dtype(dtype, cfg)
    mode = resolve_quant_mode(quant_mode, cfg)
    device = torch.device(device)
    if not 0 <= tp_rank < tp_size:
        raise ConfigError(f"tp_rank {tp_rank} outside tp_size {tp_size}")
    try:
        kernels = get_backend(backend, device.type)
    except BackendError as exc:
        raise ConfigError(str(exc)) from exc
    par = Parallel(rank=tp_rank, size=tp_size, dtype=torch_dtype, a4w4=(mode == "a4w4"), backend=kernels)
    try:
        with torch.device("meta"):
            model = DeepseekV3ForCausalLM(cfg, par)
    except ValueError as exc:  # a dimension that cannot be split this way
        raise ConfigError(f"{model_dir}: {exc}") from exc
    model.to_empty(device=device)
    specs = list(model.checkpoint_specs())
    covered = {id(s.param) for s in specs}
    orphans = [n for n, p in model.named_parameters() if id(p) not in covered]
    if orphans:
        raise RuntimeError(f"model parameters without a checkpoint tensor: {orphans}")
    load_checkpoint(model_dir, specs, cfg)
    try:
        for module in model.modules():
            if isinstance(module, (Experts, DenseMLP)):
                module.prepare()
    except BackendError as exc:  # weights the backend's kernels cannot take, e.g. NaN scales
        raise CheckpointError(f"{model_dir}: {exc}") from exc
    model.eval()
    model.quant_mode = mode
    return model, cfg
