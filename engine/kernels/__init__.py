"""Kernel backends, registered by name and imported lazily.

A backend is an object with the ops the model calls:
- `linear(x, weight, weight_scale, *, a4w4)`: y = x W^T; `weight_scale is None` means a float weight,
  otherwise `weight` is packed MXFP4 [N, K/2] with E8M0 scales [N, K/32].
- `fused_moe(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, *, a4w4)`: routed experts,
  SiLU-gated, weighted sum over the chosen experts (no all-reduce).
- `plan_attention(meta, kv_dim)`: per-step gather plan from the AttentionMetadata, built once per
  forward and shared by all layers.
- `mla(q_nope, q_pe, kv_cache, plan, scale, w_uk, w_uv)`: the attention of one layer, per-head values
  [T, H, v]; w_uk / w_uv are the key and value halves of kv_b_proj. The torch backend runs it absorbed
  through `mla_attention`; the triton backend runs prefill chunks expanded (flash SDPA) and decodes
  absorbed in a paged kernel.
- `mla_attention(q_lat, q_pe, kv_cache, plan, scale, kv_lora_rank)`: attention of the new tokens over
  the paged latent cache (absorbed MLA form), returns the latent output [T, H, kv_lora_rank].

`auto` picks triton on CUDA (validated on an H200 against the torch backend: tests/engine/*gpu*,
bench/engine_gpu_bench.py) and torch everywhere else.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

# name -> "module:Class"; modules are imported only when the backend is asked for.
BACKENDS: dict[str, str] = {
    "torch": "k2bench.engine.kernels.torch_backend:TorchBackend",
    "triton": "k2bench.engine.kernels.triton_backend:TritonBackend",
    "aiter": "k2bench.engine.kernels.aiter_backend:AiterBackend",
}


class BackendError(ValueError):
    """An unknown or unusable backend name."""


def backend_names() -> list[str]:
    return ["auto", *BACKENDS]


def resolve_backend_name(name: str, device: str) -> str:
    if name == "auto":
        return "triton" if device == "cuda" and importlib.util.find_spec("triton") is not None else "torch"
    if name not in BACKENDS:
        raise BackendError(f"unknown kernel backend {name!r}; valid: {', '.join(backend_names())}")
    return name


def get_backend(name: str = "auto", device: str = "cpu") -> Any:
    resolved = resolve_backend_name(name, device)
    module_name, _, cls_name = BACKENDS[resolved].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise BackendError(f"kernel backend {resolved!r} is registered but not implemented yet") from exc
        raise BackendError(f"kernel backend {resolved!r} is not available here: {exc}") from exc
    except ImportError as exc:
        raise BackendError(f"kernel backend {resolved!r} is not available here: {exc}") from exc
    return getattr(module, cls_name)(device)
