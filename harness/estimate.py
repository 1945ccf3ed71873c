"""How long a sweep will take, before it starts and as it goes.

A closed-loop level of concurrency c runs its requests in waves of c. Prefill is compute-bound on
every accelerator, so a wave's prompts are prefilled roughly one after another (c x the time to
first token of a lone request), while decode batches well (OSL x the time per output token). So a
level takes about ``waves x (c x ttft + osl x tpot)``. Before the first level the two times come
from one probe request; after each level, from that level's own medians (ttft divided by its
concurrency, since its requests queued for prefill behind each other). Rough, but the right order
of magnitude: it tells a 5-minute sweep from a 7-hour one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PROBE_MIN_TOKENS = 1_000_000  # below this many planned tokens a sweep is quick anywhere: no probe
TOO_LONG_S = 20 * 60.0  # an up-front estimate above this gets a warning and a quicker suggestion
QUICK_SWEEP = "k2bench sweep --isl 512 --osl 64 --conc 4..16"  # a few minutes on a 2-core CPU
FULL_ON_GPU = ("k2bench sweep --engine bundled --model <checkpoint folder> --tp <GPUs> --isl 8192 --osl 1024 "
               "--conc 4..128   (on a GPU node; or --url http://<gpu-node>:8000 --gpus <N> for a running server)")


@dataclass(frozen=True)
class Speed:
    """One request's prefill time (s) and time per output token (s) on this server."""

    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class Level:
    concurrency: int
    requests: int  # warmup included

    @property
    def waves(self) -> float:
        return self.requests / self.concurrency


def level_seconds(level: Level, osl: int, speed: Speed) -> float:
    return level.waves * (level.concurrency * speed.ttft_s + osl * speed.tpot_s)


def sweep_seconds(levels: Sequence[Level], osl: int, speed: Speed) -> float:
    return sum(level_seconds(lv, osl, speed) for lv in levels)


def speed_from_point(point: dict) -> Speed | None:
    """The model's two times as a finished level measured them (None without latencies)."""
    ttft_ms = (point.get("ttft_ms") or {}).get("median")
    tpot_ms = (point.get("tpot_ms") or {}).get("median")
    if ttft_ms is None or tpot_ms is None:
        return None
    return Speed(ttft_s=ttft_ms / 1000 / point["concurrency"], tpot_s=tpot_ms / 1000)


def planned_tokens(levels: Sequence[Level], isl: int, osl: int) -> int:
    return sum(lv.requests for lv in levels) * (isl + osl)


def duration_text(seconds: float) -> str:
    """'40 s', '12 min', '7.5 h': as precise as an estimate deserves."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def too_long_warning(seconds: float, speed: Speed, isl: int, on_cpu: bool) -> str | None:
    """The up-front warning for a sweep this server will take long over (None when it is quick)."""
    if seconds <= TOO_LONG_S:
        return None
    text = (f"warning: this sweep will take about {duration_text(seconds)} here (one request of {isl} input "
            f"tokens: {speed.ttft_s:.2f} s to its first token, {1000 * speed.tpot_s:.1f} ms per output token); "
            f"it goes on (Ctrl-C keeps the finished levels).\n"
            f"  a sweep that finishes in minutes: {QUICK_SWEEP}")
    if on_cpu:
        text += f"\n  the full sweep on a GPU: {FULL_ON_GPU}"
    return text
