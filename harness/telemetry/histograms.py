"""Prometheus histograms over a window: bucket deltas between two scrapes, and quantiles read from them.

A server's histogram is cumulative since it started, so the window's own distribution is the
difference of each cumulative bucket count between the window's closing and opening scrapes.
Quantiles are read from those deltas the way Prometheus' ``histogram_quantile`` reads them: find
the bucket the rank falls in and interpolate linearly between its bounds (the lowest bucket starts
at 0). The observations are only known to lie somewhere in that bucket, so the error of a quantile
is at most the width of the bucket it fell in; that bucket is kept beside the value. A rank in the
open ``+Inf`` bucket is reported as the highest finite bound (a lower bound on the truth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Scrape = dict[str, tuple[str, float]]  # as k2bench.harness.telemetry.server_metrics.parse returns it
BUCKET_SEP = " le="  # a bucket's key: the series key, BUCKET_SEP, the bound (parse writes it so)


@dataclass(frozen=True)
class Delta:
    """One histogram series over a window: finite upper bounds, cumulative counts (one more than the
    bounds: the last is ``+Inf``, the total) and the sum of the observed values."""

    le: tuple[float, ...]
    cum: tuple[float, ...]
    sum: float

    @property
    def count(self) -> float:
        return self.cum[-1]

    def to_json(self) -> dict:
        """Stored trimmed to the buckets that hold observations, with the bound just below them (so
        every quantile reads the same from the stored form); the last count stays the total."""
        finite = self.cum[:-1]
        start = next((i for i, c in enumerate(finite) if c > 0), len(finite))
        start = max(start - 1, 0)
        stop = next((i + 1 for i, c in enumerate(finite) if c >= self.count), len(finite))
        return {"le": list(self.le[start:stop]), "cum": [_num(c) for c in (*finite[start:stop], self.count)],
                "sum": round(self.sum, 9)}

    @classmethod
    def from_json(cls, doc: dict) -> Delta:
        return cls(tuple(float(x) for x in doc["le"]), tuple(float(x) for x in doc["cum"]), float(doc["sum"]))


def bucket_key(series_key: str, le: str) -> str:
    return f"{series_key}{BUCKET_SEP}{le}"


def series(scrape: Scrape) -> dict[str, tuple[dict[float, float], float]]:
    """Every histogram series of a scrape: series key (family name and labels, ``le`` left out) ->
    ({upper bound: cumulative count}, sum)."""
    out: dict[str, dict[float, float]] = {}
    for key, (kind, value) in scrape.items():
        if kind == "bucket":
            skey, _, le = key.rpartition(BUCKET_SEP)
            out.setdefault(skey, {})[float(le)] = value
    return {k: (b, scrape.get(_sum_key(k), ("counter", 0.0))[1]) for k, b in out.items()}


def _sum_key(series_key: str) -> str:
    name, brace, rest = series_key.partition("{")
    return f"{name}_sum{brace}{rest}"


def deltas(first: Scrape, last: Scrape) -> tuple[dict[str, Delta], list[str]]:
    """The window's share of every histogram in ``last``, and the series that could not be taken
    (their bounds changed or a count went backwards: the server restarted)."""
    start, end = series(first), series(last)
    out: dict[str, Delta] = {}
    bad: list[str] = []
    for key, (buckets, total) in sorted(end.items()):
        before, before_sum = start.get(key, ({}, 0.0))  # a series born during the window started empty
        if before and set(before) != set(buckets):
            bad.append(key)
            continue
        bounds = sorted(buckets)
        cum = [buckets[b] - before.get(b, 0.0) for b in bounds]
        if any(c < 0 for c in cum) or any(b < a for a, b in zip(cum, cum[1:], strict=False)):
            bad.append(key)
            continue
        if not bounds or not math.isinf(bounds[-1]):
            bad.append(key)  # not a well-formed histogram: Prometheus always has the +Inf bucket
            continue
        out[key] = Delta(tuple(bounds[:-1]), tuple(cum), total - before_sum)
    return out, bad


def pool(parts: list[Delta]) -> Delta | None:
    """Several series of one family (labels such as engine or model) as one distribution; None when
    their buckets differ (they cannot be added bucket by bucket)."""
    if not parts:
        return None
    if any(p.le != parts[0].le for p in parts):
        return None
    return Delta(parts[0].le, tuple(map(sum, zip(*(p.cum for p in parts), strict=True))), sum(p.sum for p in parts))


def quantile(d: Delta, q: float) -> tuple[float, float, float] | None:
    """(value, bucket low, bucket high) of quantile ``q`` by linear interpolation within the bucket the
    rank falls in; the truth lies within [low, high]. None when the window saw no observation."""
    total = d.count
    if total <= 0:
        return None
    rank = q * total
    prev_cum, low = 0.0, 0.0
    for le, c in zip(d.le, d.cum, strict=False):  # cum has one more: +Inf
        if c >= rank and c > prev_cum:
            return low + (le - low) * (rank - prev_cum) / (c - prev_cum), low, le
        prev_cum, low = c, le
    top = d.le[-1] if d.le else 0.0
    return top, top, math.inf


def _num(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value
