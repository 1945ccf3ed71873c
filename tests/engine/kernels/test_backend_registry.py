"""Backend names and the `KernelBackend` interface: what a user picks with --backend, and what the model
may call on whatever it gets."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from k2bench.engine.kernels import BackendError, KernelBackend, backend_names, get_backend  # noqa: E402
from k2bench.engine.kernels.torch_backend import TorchBackend  # noqa: E402

OPS = ("linear", "rms_norm", "swiglu", "fused_moe", "dense_mlp", "prepare_moe", "prepare_dense", "plan_attention",
       "decode_plan", "mla")


def test_aiter_is_an_unknown_backend_that_lists_the_valid_ones():
    """No name without an implementation: asking for aiter says which backends exist."""
    with pytest.raises(BackendError, match=r"unknown kernel backend 'aiter'; valid: auto, torch, triton$"):
        get_backend("aiter", "cpu")
    assert backend_names() == ["auto", "torch", "triton"]


def test_names_are_listed_without_importing_torch():
    """`k2bench serve --help` and the name check must work on a harness-only install."""
    code = ("import sys, k2bench.engine.kernels as k; print(','.join(k.backend_names())); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["auto,torch,triton", "False"]


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("op", OPS)
def test_torch_backend_has_every_op_with_the_interfaces_signature(op):
    assert _params(getattr(TorchBackend, op)) == _params(getattr(KernelBackend, op))


def test_backends_declare_whether_decode_steps_can_be_graphed():
    assert get_backend("torch", "cpu").graph_decode is False
    assert get_backend("auto", "cpu").name == "torch"
