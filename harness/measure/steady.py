"""Steady state: the part of a level in which the load was what was asked for, and one-second slices.

A closed level starts with every request sent at once (all prefilling together) and ends draining, with
fewer and fewer in flight; both ends run at a load the level did not ask for, and how long they last
varies from run to run. The steady-state window is where at least STEADY_FRACTION of the intended
concurrency was in flight: from the first moment the count of requests in flight reached
ceil(0.9 x concurrency) to the last moment it fell below that. Over the window:

- steady_tput_per_gpu = (output tokens whose messages arrived in the window + prompt tokens of requests
  whose first token arrived in it) / window / num_gpus; steady_output_tput_per_gpu likewise, output only.
  A message carrying k tokens counts k (the request's usage.completion_tokens / its token messages).
- steady_tpot_ms: TPOT of the requests sent and finished inside the window.
- steady_itl_ms: the gaps between token messages with both ends inside the window.

Slices cut the level (first measured send to last end) into SLICE_S pieces: output tokens/s that arrived
in each, the time-averaged requests in flight, and TPOT as (sum of the message gaps ending in it) /
(tokens those messages brought). Everything comes from the stored stamps, so it can be recomputed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.catalogue import STAT_KEYS

STEADY_FRACTION = 0.9
SLICE_S = 1.0
_NS = 1e9


def _in_flight(recs: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(event times, requests in flight just after each), ends before sends at equal times."""
    sends = np.array([r.send_ns for r in recs], dtype=np.int64)
    ends = np.array([r.end_ns for r in recs], dtype=np.int64)
    times = np.concatenate([ends, sends])
    steps = np.concatenate([-np.ones(len(ends), np.int64), np.ones(len(sends), np.int64)])
    order = np.lexsort((steps, times))
    return times[order], np.cumsum(steps[order])


def window(recs: Sequence[RequestRecord], concurrency: int) -> tuple[int, int] | None:
    """(start, end) ns of the steady-state window, or None when the count never reached the threshold."""
    recs = [r for r in recs if r.send_ns and r.end_ns is not None]
    if not recs:
        return None
    times, count = _in_flight(recs)
    threshold = math.ceil(STEADY_FRACTION * concurrency)
    above = np.flatnonzero(count >= threshold)
    if not above.size:
        return None
    last = above[-1]
    return int(times[above[0]]), int(times[min(last + 1, len(times) - 1)])


def _stats(values: np.ndarray) -> dict:
    if values.size == 0:
        return {k: None for k in STAT_KEYS}
    p50, p90, p99, p999 = np.percentile(values, [50, 90, 99, 99.9], method="linear")
    return {"mean": float(values.mean()), "median": float(p50), "std": float(values.std()), "p90": float(p90),
            "p99": float(p99), "p99.9": float(p999)}


def _slices(recs: Sequence[RequestRecord], done: Sequence[RequestRecord], t0: int, t1: int) -> dict:
    edges = np.arange(t0, t1, int(SLICE_S * _NS), dtype=np.int64)
    bounds = np.append(edges, t1)
    width = np.diff(bounds) / _NS
    n = len(edges)
    tokens = np.zeros(n)
    gap_ns = np.zeros(n)
    gap_tokens = np.zeros(n)
    for r in done:
        ts = np.asarray(r.token_ns, dtype=np.int64)
        per = (r.output_tokens or 0) / len(ts)
        # a stamp at the level's very end belongs to the last slice (closed on the right)
        slot = np.minimum(np.searchsorted(bounds, ts, "right") - 1, n - 1)
        tokens += per * np.bincount(slot, minlength=n)
        if len(ts) > 1:
            where = slot[1:]
            gap_ns += np.bincount(where, weights=np.diff(ts), minlength=n)
            gap_tokens += per * np.bincount(where, minlength=n)
    times, count = _in_flight(recs)
    area = np.concatenate([[0.0], np.cumsum(count[:-1] * np.diff(times).astype(np.float64))])
    covered = np.interp(bounds.astype(np.float64), times.astype(np.float64), area)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(gap_tokens > 0, gap_ns / 1e6 / gap_tokens, np.nan)
    return {"t_s": [round(float(e - t0) / _NS, 3) for e in edges],
            "output_tok_s": [float(x) for x in tokens / width],
            "in_flight": [float(x) for x in np.diff(covered) / (width * _NS)],
            "tpot_ms": [None if math.isnan(x) else float(x) for x in tpot]}


def summarize_steady(records: Sequence[RequestRecord], *, concurrency: int, num_gpus: int) -> dict:
    """The steady-state fields of a level's point: ``steady`` (the window and the slices) and the flat
    steady_* figures (None where the window is missing or holds no such request)."""
    recs = [r for r in records if not r.warmup and r.send_ns and r.end_ns is not None]
    done = [r for r in recs if r.success and r.token_ns]
    out: dict = {"steady": None, "steady_duration_s": None, "steady_tput_per_gpu": None,
                 "steady_output_tput_per_gpu": None, "steady_tpot_ms": _stats(np.zeros(0)),
                 "steady_itl_ms": _stats(np.zeros(0))}
    if not recs:
        return out
    t0, t1 = min(r.send_ns for r in recs), max(r.end_ns for r in recs)
    steady: dict = {"fraction": STEADY_FRACTION, "threshold": math.ceil(STEADY_FRACTION * concurrency),
                    "start_s": None, "end_s": None, "slice_s": SLICE_S, "slices": _slices(recs, done, t0, t1)}
    out["steady"] = steady
    win = window(recs, concurrency)
    if win is None or win[1] <= win[0]:
        return out
    a, b = win
    span = (b - a) / _NS
    steady["start_s"], steady["end_s"] = (a - t0) / _NS, (b - t0) / _NS
    out_tokens = in_tokens = 0.0
    tpots, gaps = [], []
    for r in done:
        ts = np.asarray(r.token_ns, dtype=np.int64)
        lo, hi = np.searchsorted(ts, a, "left"), np.searchsorted(ts, b, "right")
        out_tokens += (hi - lo) * (r.output_tokens or 0) / len(ts)
        if a <= ts[0] <= b:
            in_tokens += r.prompt_tokens if r.prompt_tokens is not None else r.requested_input_tokens
        if hi - lo > 1:
            gaps.append(np.diff(ts[lo:hi]))
        if r.send_ns >= a and ts[-1] <= b and r.output_tokens and r.output_tokens > 1:
            tpots.append((ts[-1] - ts[0]) / 1e6 / (r.output_tokens - 1))
    out["steady_duration_s"] = span
    out["steady_tput_per_gpu"] = (in_tokens + out_tokens) / span / num_gpus
    out["steady_output_tput_per_gpu"] = out_tokens / span / num_gpus
    out["steady_tpot_ms"] = _stats(np.asarray(tpots, dtype=np.float64))
    out["steady_itl_ms"] = _stats(np.concatenate(gaps).astype(np.float64) / 1e6 if gaps else np.zeros(0))
    return out
