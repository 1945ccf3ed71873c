"""Kernel backends: the `KernelBackend` interface (backend.py) and the names a user can pick.

Each name maps to a factory that imports its module only when asked for, so the CLI starts and lists
the names without torch. `auto` picks triton on CUDA (validated on an H200 against the torch backend:
tests/engine/kernels/*gpu*, bench/engine_gpu_bench.py) and torch everywhere else. On MI355X the
triton backend is the path (Triton's ROCm backend); an aiter backend gets a name only once it exists
and has run on a ROCm machine.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from k2bench.engine.kernels.backend import AttentionPlan, BackendError, KernelBackend

__all__ = ["AttentionPlan", "BACKENDS", "BackendError", "KernelBackend", "backend_names", "get_backend",
           "resolve_backend_name"]


def _torch(device: str) -> KernelBackend:
    from k2bench.engine.kernels.torch_backend import TorchBackend

    return TorchBackend(device)


def _triton(device: str) -> KernelBackend:
    from k2bench.engine.kernels.triton_backend import TritonBackend

    return TritonBackend(device)


BACKENDS: dict[str, Callable[[str], KernelBackend]] = {"torch": _torch, "triton": _triton}


def backend_names() -> list[str]:
    return ["auto", *BACKENDS]


def resolve_backend_name(name: str, device: str) -> str:
    if name == "auto":
        return "triton" if device == "cuda" and importlib.util.find_spec("triton") is not None else "torch"
    if name not in BACKENDS:
        raise BackendError(f"unknown kernel backend {name!r}; valid: {', '.join(backend_names())}")
    return name


def get_backend(name: str = "auto", device: str = "cpu") -> KernelBackend:
    resolved = resolve_backend_name(name, device)
    try:
        return BACKENDS[resolved](device)
    except ImportError as exc:  # e.g. triton not installed on this platform
        raise BackendError(f"kernel backend {resolved!r} is not available here: {exc}") from exc
