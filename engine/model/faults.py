"""A test-only fault in the MXFP4 path, so tests can show the accuracy gate catching a numerical bug.

With K2BENCH_TEST_MXFP4_SCALE_SHIFT=k set in the server's environment, every E8M0 weight scale is
read k exponents off (k=1: each quantised weight block decodes twice too large). It is applied when
the checkpoint is loaded, so every kernel backend sees the same wrong weights at the same speed:
throughput is unchanged, only the numbers are wrong. Never set it outside tests.
"""

from __future__ import annotations

import logging
import os

import torch

SCALE_SHIFT_ENV = "K2BENCH_TEST_MXFP4_SCALE_SHIFT"
_log = logging.getLogger(__name__)
_warned: set[int] = set()


def scale_shift() -> int:
    """The configured shift (0 when unset), refusing anything but an integer."""
    raw = os.environ.get(SCALE_SHIFT_ENV, "").strip()
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{SCALE_SHIFT_ENV} must be an integer exponent shift, not {raw!r}") from exc


def apply_scale_fault(name: str, t: torch.Tensor) -> torch.Tensor:
    """`t` unchanged, unless it is a weight scale and the test fault is switched on."""
    shift = scale_shift()
    if not shift or not name.endswith(".weight_scale"):
        return t
    if shift not in _warned:
        _warned.add(shift)
        _log.warning("test fault %s=%d: every MXFP4 weight scale is read %d exponent(s) off",
                     SCALE_SHIFT_ENV, shift, shift)
    return (t.to(torch.int32) + shift).clamp(0, 254).to(torch.uint8)
