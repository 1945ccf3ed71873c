"""How long a sweep will take, before it starts and as it goes.

A closed-loop level of concurrency c runs its requests in waves of c. Prefill is compute-bound, so
a wave's c prompts are prefilled roughly one after another (c x one prompt's share); decode is batch
decode: each step advances all c requests at once, and a step at batch c costs the weights' read
once plus each sequence's cache (and, for a MoE, the experts its tokens touch). So a level takes
about ``waves x (c x prefill + osl x step(c))``, with ``step(c) = step(1) + (c - 1) x per_seq``. It is
never one request's TPOT times the number of requests: that reads every step as if it served one.

Before the first level the figures come from a probe (k2bench.harness.run.sweep): one lone request,
which also takes the server's cold start (first-call compilation, plans, allocation) out of what
follows, then one small batch of PROBE_BATCH requests. The batch gives the prefill share (its last
first token / its size) and step(PROBE_BATCH); the lone request gives step(1); the two give the
per-sequence cost. After each level, the finished levels' own figures replace the probe's. Rough,
but the right order of magnitude: it tells a 5-minute sweep from a 7-hour one (on the design card's
recorded H200 sweeps it says 0.9x to 2.8x what the levels took, where the old estimate said 10x:
docs/harness.md, "How long a sweep will take").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

PROBE_MIN_TOKENS = 1_000_000  # below this many planned tokens a sweep is quick anywhere: no probe
PROBE_BATCH = 4  # requests of the probe's batch (capped at the first level's concurrency)
PROBE_OUTPUT_TOKENS = 64  # output tokens each probe request asks for: enough for a step time
TOO_LONG_S = 20 * 60.0  # an up-front estimate above this gets a warning and a quicker suggestion
QUICK_SWEEP = "k2bench sweep --isl 512 --osl 64 --conc 4..16"  # a few minutes on a 2-core CPU
FULL_ON_GPU = ("k2bench sweep --engine bundled --model <checkpoint folder> --tp <GPUs> --isl 8192 --osl 1024 "
               "--conc 4..128   (on a GPU node; or --url http://<gpu-node>:8000 --gpus <N> for a running server)")


@dataclass(frozen=True)
class Speed:
    """What a level costs on this server: one prompt's share of a wave's prefill (s), a decode step at
    batch 1 (s) and what each more sequence in the batch adds to a step (s)."""

    prefill_s: float
    step_s: float
    per_seq_s: float = 0.0

    def step_at(self, batch: int) -> float:
        return self.step_s + (batch - 1) * self.per_seq_s


@dataclass(frozen=True)
class Level:
    concurrency: int
    requests: int  # warmup included

    @property
    def waves(self) -> float:
        return self.requests / self.concurrency


def level_seconds(level: Level, osl: int, speed: Speed) -> float:
    """One level: waves x (the wave's prefill + OSL batch-decode steps at its concurrency)."""
    c = level.concurrency
    return level.waves * (c * speed.prefill_s + osl * speed.step_at(c))


def sweep_seconds(levels: Sequence[Level], osl: int, speed: Speed) -> float:
    return sum(level_seconds(lv, osl, speed) for lv in levels)


def _ttft_tpot(m: dict) -> tuple[float, float] | None:
    """(TTFT, TPOT) in s of one request's metrics (k2bench.harness.measure.metrics.request_metrics), or None."""
    if m.get("ttft_ms") is None or m.get("tpot_ms") is None:
        return None
    return m["ttft_ms"] / 1000, m["tpot_ms"] / 1000


def speed_from_probe(lone: dict, batch: Sequence[dict]) -> Speed | None:
    """The level cost a probe measured: ``lone`` is one request's metrics, ``batch`` those of the
    requests sent together after it (empty: the lone request alone, no per-sequence cost)."""
    one = _ttft_tpot(lone)
    together = [t for t in map(_ttft_tpot, batch) if t is not None]
    if one is None:
        return None
    if len(together) < 2:
        return Speed(prefill_s=one[0], step_s=one[1])
    prefill = max(ttft for ttft, _ in together) / len(together)
    step_b = statistics.median(tpot for _, tpot in together)
    per_seq = max(0.0, (step_b - one[1]) / (len(together) - 1))
    return Speed(prefill_s=prefill, step_s=min(one[1], step_b), per_seq_s=per_seq)


def speed_from_points(points: Sequence[dict], before: Speed | None = None) -> Speed | None:
    """The level cost as finished levels measured it: the prefill share from each level's p99 TTFT
    (the last prompts of a wave wait for the others' prefill) over its concurrency, the step from
    the TPOT medians, a line through them when two or more concurrencies finished (else the
    probe's per-sequence cost, ``before``, or none)."""
    seen = []
    for p in points:
        ttft, tpot = (p.get("ttft_ms") or {}), (p.get("tpot_ms") or {})
        first = ttft.get("p99") if ttft.get("p99") is not None else ttft.get("median")
        if first is None or tpot.get("median") is None:
            continue
        seen.append((p["concurrency"], first / 1000 / p["concurrency"], tpot["median"] / 1000))
    if not seen:
        return None
    prefill = statistics.median(share for _, share, _ in seen)
    concs = {c for c, _, _ in seen}
    if len(concs) >= 2:
        slope, intercept = statistics.linear_regression([c for c, _, _ in seen], [t for _, _, t in seen])
        slope = max(0.0, slope)
        return Speed(prefill_s=prefill, step_s=max(intercept + slope, 1e-6), per_seq_s=slope)
    c, _, step_c = seen[-1]
    per_seq = before.per_seq_s if before is not None else 0.0
    return Speed(prefill_s=prefill, step_s=max(step_c - (c - 1) * per_seq, 1e-6), per_seq_s=per_seq)


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
    text = (f"warning: this sweep will take about {duration_text(seconds)} here (prompts of {isl} tokens: "
            f"{speed.prefill_s:.2f} s of prefill each; a decode step {1000 * speed.step_s:.1f} ms at batch 1, "
            f"+{1000 * speed.per_seq_s:.2f} ms per more request in the batch); "
            f"it goes on (Ctrl-C keeps the finished levels).\n"
            f"  a sweep that finishes in minutes: {QUICK_SWEEP}")
    if on_cpu:
        text += f"\n  the full sweep on a GPU: {FULL_ON_GPU}"
    return text
