"""Service-level objectives: which requests were good, what share of a level was, and the goodput.

A request meets an SLO when every metric the SLO names is within its bound (``value <= bound``),
which is vLLM's ``--goodput`` rule (vllm/benchmarks/serve.py, ``calculate_metrics``): only requests
that succeeded can be good; a request with fewer than two output tokens has a TPOT of 0 there, so it
never fails a TPOT bound, and here likewise. ``itl_p99_ms`` (not in vLLM) is the 99th percentile of
the request's own gaps between token messages (numpy's linear rule); a request with no gap has 0.

Per level, over the measured requests (warmup left out, failed requests counted and never good):
- attainment = met / n, with a Clopper-Pearson ("exact") binomial interval. It is chosen over Wilson
  because its coverage is never below the nominal level for any true attainment, and SLO targets sit
  near 1 (0.99), where Wilson's interval can cover less often than it claims; the price is a slightly
  wider interval, which errs towards "not shown to meet the target".
- goodput_rps = met / duration and goodput_per_gpu = (input + output tokens of the good requests) /
  duration / num_gpus, with duration the level's own (first send to last finish, the duration of every
  other throughput figure; an imported level keeps its tool's duration, as vLLM's request_goodput does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from k2bench.errors import UserError
from k2bench.harness.load.records import RequestRecord

__all__ = ["CONFIDENCE", "FIELDS", "SLO_METRICS", "Attainment", "Slo", "attainment", "binomial_interval",
           "meets", "parse_slo", "request_values"]

# name -> what it bounds; the order is the canonical order of an SLO's text
SLO_METRICS: dict[str, str] = {
    "ttft_ms": "time to first token (ms)",
    "tpot_ms": "time per output token after the first (ms)",
    "e2el_ms": "end-to-end latency (ms)",
    "itl_p99_ms": "99th percentile of the request's own inter-token gaps (ms)",
}
CONFIDENCE = 0.95
# the level fields that carry a level's figures against its run's SLO (record.schema declares them)
FIELDS = ("slo_attainment", "slo_attainment_low", "slo_attainment_high", "slo_met", "goodput_rps",
          "goodput_per_gpu")
_NS_PER_MS = 1e6


@dataclass(frozen=True)
class Slo:
    """Upper bounds in ms, by metric name, in SLO_METRICS order."""

    bounds: tuple[tuple[str, float], ...]

    @property
    def text(self) -> str:
        """The canonical spelling, e.g. ``ttft_ms=2000,tpot_ms=50``; parse_slo(text) gives the same Slo."""
        return ",".join(f"{name}={bound:g}" for name, bound in self.bounds)

    def as_dict(self) -> dict[str, float]:
        return dict(self.bounds)

    def __str__(self) -> str:
        return self.text


def parse_slo(text: str) -> Slo:
    """``ttft_ms=2000,tpot_ms=50[,e2el_ms=...,itl_p99_ms=...]`` -> Slo; UserError on anything else."""
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"--slo: expected name=ms pairs such as ttft_ms=2000,tpot_ms=50, got {text!r}")
    found: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        if not sep or not name:
            raise UserError(f"--slo: {part.strip()!r} is not name=ms (e.g. ttft_ms=2000)")
        if name not in SLO_METRICS:
            raise UserError(f"--slo: unknown metric {name!r}; known: {', '.join(SLO_METRICS)}")
        if name in found:
            raise UserError(f"--slo: {name} is given twice")
        try:
            bound = float(value)
        except ValueError:
            raise UserError(f"--slo: {name}={value.strip()!r} is not a number of milliseconds") from None
        if not np.isfinite(bound) or bound <= 0:
            raise UserError(f"--slo: {name} must be a finite number of ms > 0, got {value.strip()!r}")
        found[name] = bound
    return Slo(tuple((name, found[name]) for name in SLO_METRICS if name in found))


def request_values(record: RequestRecord) -> dict[str, float] | None:
    """The SLO metrics of one request in ms; None when it failed or produced no token (never good)."""
    if not record.success or not record.token_ns:
        return None
    stamps = np.asarray(record.token_ns, dtype=np.int64)
    ttft = (stamps[0] - record.send_ns) / _NS_PER_MS
    e2el = (stamps[-1] - record.send_ns) / _NS_PER_MS
    out_tokens = record.output_tokens
    tpot = (e2el - ttft) / (out_tokens - 1) if out_tokens is not None and out_tokens > 1 else 0.0
    gaps = np.diff(stamps) / _NS_PER_MS
    itl_p99 = float(np.percentile(gaps, 99, method="linear")) if gaps.size else 0.0
    return {"ttft_ms": float(ttft), "tpot_ms": float(tpot), "e2el_ms": float(e2el), "itl_p99_ms": itl_p99}


def meets(record: RequestRecord, slo: Slo) -> bool:
    """True when the request succeeded and every bound of the SLO holds (bounds are inclusive)."""
    values = request_values(record)
    return values is not None and all(values[name] <= bound for name, bound in slo.bounds)


def binomial_interval(met: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Clopper-Pearson interval of a proportion met/n (scipy); None when n is 0."""
    if n <= 0:
        return None
    from scipy.stats import binomtest

    ci = binomtest(met, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


@dataclass(frozen=True)
class Attainment:
    """One level against one SLO."""

    met: int
    n: int  # measured requests, failed ones included
    low: float | None  # the interval of the fraction (None when n is 0)
    high: float | None
    goodput_rps: float | None  # None when the level has no duration
    goodput_per_gpu: float | None
    confidence: float = CONFIDENCE

    @property
    def fraction(self) -> float | None:
        return self.met / self.n if self.n else None

    def fields(self) -> dict:
        """The level fields under which a point carries these figures (catalogue columns)."""
        return {"slo_attainment": self.fraction, "slo_attainment_low": self.low, "slo_attainment_high": self.high,
                "slo_met": self.met, "goodput_rps": self.goodput_rps,
                "goodput_per_gpu": self.goodput_per_gpu}


def attainment(records: Iterable[RequestRecord], slo: Slo, *, duration_s: float | None, num_gpus: int,
               confidence: float = CONFIDENCE) -> Attainment:
    """Attainment and goodput of one level's records (warmup records are left out here).

    ``duration_s`` is the level's stored duration (metrics.summarize_level's ``duration_s``).
    """
    recs: Sequence[RequestRecord] = [r for r in records if not r.warmup]
    good = [r for r in recs if meets(r, slo)]
    n, met = len(recs), len(good)
    interval = binomial_interval(met, n, confidence)
    rps = per_gpu = None
    if duration_s:
        tokens = sum((r.prompt_tokens if r.prompt_tokens is not None else r.requested_input_tokens)
                     + (r.output_tokens or 0) for r in good)
        rps = met / duration_s
        per_gpu = tokens / duration_s / num_gpus
    return Attainment(met=met, n=n, low=interval[0] if interval else None, high=interval[1] if interval else None,
                      goodput_rps=rps, goodput_per_gpu=per_gpu, confidence=confidence)
