"""Per-request and per-level metrics, derived only from raw RequestRecord stamps.

Definitions (InferenceX-compatible, defined for users in docs/concepts.md, "Metric definitions"):

Per request (stamps are client monotonic ns taken when each SSE message arrived):
- TTFT = first token-carrying message - request sent.
- E2EL = last token-carrying message - request sent (the usage-only tail is excluded).
- TPOT = (E2EL - TTFT) / (output_tokens - 1), output_tokens = usage.completion_tokens.
- ITL  = gaps between consecutive token-carrying messages; a message carrying k tokens is one gap.

Per level (warmup records ignored; duration = first send to last finish (end_ns)):
- tput_per_gpu = (input + output tokens of completed requests) / duration / num_gpus.
- interactivity = 1000 / TPOT percentile in ms ("tok/s/user"), see ``_interactivity``.

Steady-state figures (the window with >= 90% of the concurrency in flight, one-second slices) are
defined in k2bench.harness.measure.steady. Labels, units and directions of these figures are in k2bench.harness.measure.catalogue.

Percentiles are numpy's default linear interpolation (``np.percentile(..., method="linear")``);
std is the population standard deviation (ddof=0), as vLLM's benchmark_serving reports it.
Failed requests are counted (``failed``) but excluded from every latency and throughput figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise

import numpy as np

from k2bench.errors import UserError
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure import workload_metrics
from k2bench.harness.measure.catalogue import INTERACTIVITY_KEYS, LATENCY_METRICS, STAT_KEYS
from k2bench.harness.measure.steady import summarize_steady

__all__ = ["INTERACTIVITY_KEYS", "LATENCY_METRICS", "STAT_KEYS", "measured", "request_metrics", "stats",
           "summarize_level"]

MAX_ERRORS_KEPT = 5

_NS_PER_MS = 1e6


def request_metrics(record: RequestRecord, with_itl: bool = True) -> dict:
    """Latencies of one request in ms; None where a figure does not apply.

    A failed request, or one that produced no token message, has no latencies. TPOT needs the
    server's usage.completion_tokens and at least two output tokens. ``with_itl=False`` skips
    the per-gap list (itl_ms is then None), for callers that pool gaps themselves.
    """
    out: dict = {"ttft_ms": None, "tpot_ms": None, "e2el_ms": None, "itl_ms": None}
    if not record.success or not record.token_ns:
        return out
    stamps = record.token_ns
    ttft = (stamps[0] - record.send_ns) / _NS_PER_MS
    e2el = (stamps[-1] - record.send_ns) / _NS_PER_MS
    out["ttft_ms"] = ttft
    out["e2el_ms"] = e2el
    if with_itl:
        out["itl_ms"] = [(b - a) / _NS_PER_MS for a, b in pairwise(stamps)]
    if record.output_tokens is not None and record.output_tokens > 1:
        out["tpot_ms"] = (e2el - ttft) / (record.output_tokens - 1)
    return out


def stats(values: Sequence[float] | np.ndarray) -> dict:
    """mean, median, std, p90, p99, p99.9 of values (None for each when there are none)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {k: None for k in STAT_KEYS}
    p50, p90, p99, p999 = np.percentile(arr, [50, 90, 99, 99.9], method="linear")
    return {
        "mean": float(arr.mean()),
        "median": float(p50),
        "std": float(arr.std()),
        "p90": float(p90),
        "p99": float(p99),
        "p99.9": float(p999),
    }


def _interactivity(tpot: dict) -> dict:
    """tok/s/user from TPOT percentiles.

    interactivity.median = 1000 / tpot_ms.median, interactivity.p90 = 1000 / tpot_ms.p90 and
    interactivity.p99 = 1000 / tpot_ms.p99. Because interactivity is the inverse of TPOT, the
    "p90" figure is a tail: about 90% of completed requests were at least this interactive. It is
    the 10th percentile of per-request 1000/TPOT only where the percentile falls on a sample: the
    linear interpolation between two TPOTs is not inverted exactly. Likewise p99.
    """
    out = {}
    for key in INTERACTIVITY_KEYS:
        value = tpot.get(key)
        out[key] = 1000.0 / value if value else None
    return out


def _pooled_gaps_ms(records: Sequence[RequestRecord]) -> np.ndarray:
    """Every gap between consecutive token messages of the given requests, in ms (same as
    concatenating request_metrics(r)["itl_ms"], computed with numpy for 1M-token levels)."""
    parts = [np.diff(np.asarray(r.token_ns, dtype=np.int64)) for r in records if len(r.token_ns) > 1]
    if not parts:
        return np.zeros(0, dtype=np.float64)
    return np.concatenate(parts).astype(np.float64) / _NS_PER_MS


def measured(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if not r.warmup]


def summarize_level(
    records: Sequence[RequestRecord], *, concurrency: int, num_gpus: int, trial: int = 0
) -> dict:
    """The "points" entry of a k2bench.run document for one concurrency level.

    Input tokens count usage.prompt_tokens where the server reported it, else the requested
    ISL; output tokens count usage.completion_tokens (a successful request without usage adds
    none and has no TPOT). Requests whose completion_tokens differs from the requested OSL are
    counted in ``osl_mismatches`` and still included.
    """
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise UserError(f"num_gpus must be a whole number >= 1, got {num_gpus!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise UserError(f"concurrency must be a whole number >= 1, got {concurrency!r}")
    recs = measured(records)
    done = [r for r in recs if r.success]
    errors: list[str] = []
    for r in sorted(recs, key=lambda r: r.index):
        if not r.success and len(errors) < MAX_ERRORS_KEPT:
            errors.append(r.error or "unknown error")

    duration = None
    if recs:
        ends = [r.end_ns for r in recs if r.end_ns is not None]
        if ends:
            span_ns = max(ends) - min(r.send_ns for r in recs)
            duration = span_ns / 1e9 if span_ns > 0 else None

    input_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.requested_input_tokens for r in done)
    output_tokens = sum(r.output_tokens or 0 for r in done)

    def per_gpu(tokens: int) -> float | None:
        return tokens / duration / num_gpus if duration else None

    per_req = [request_metrics(r, with_itl=False) for r in done]
    lat = {
        "ttft_ms": [m["ttft_ms"] for m in per_req if m["ttft_ms"] is not None],
        "tpot_ms": [m["tpot_ms"] for m in per_req if m["tpot_ms"] is not None],
        "itl_ms": _pooled_gaps_ms(done),
        "e2el_ms": [m["e2el_ms"] for m in per_req if m["e2el_ms"] is not None],
    }
    point: dict = {
        "concurrency": concurrency,
        "trial": trial,
        "num_prompts": len(recs),
        "completed": len(done),
        "failed": len(recs) - len(done),
        "osl_mismatches": sum(1 for r in recs if r.osl_mismatch),
        "errors": errors,
        "duration_s": duration,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "tput_per_gpu": per_gpu(input_tokens + output_tokens),
        "output_tput_per_gpu": per_gpu(output_tokens),
        "input_tput_per_gpu": per_gpu(input_tokens),
    }
    summaries = {name: stats(values) for name, values in lat.items()}
    point["interactivity"] = _interactivity(summaries["tpot_ms"])
    point.update(summaries)
    point.update(summarize_steady(records, concurrency=concurrency, num_gpus=num_gpus))
    # only what applies: a level of random prompts against a server without a cache has none of them
    point.update({k: v for k, v in workload_metrics.level_fields(recs).items() if v is not None})
    return point
