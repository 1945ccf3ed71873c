"""Seeded arrival schedules for open-loop (rate) levels: when each request should be sent.

Gaps between arrivals are gamma-distributed with shape K (the burstiness) and mean 1 / rate, so
their coefficient of variation is 1 / sqrt(K): K = 1 is a Poisson process, K > 1 is steadier, K < 1
burstier (vLLM's and AIPerf's definition). A rate of ``inf`` sends every request at once.

A ramp-up of R seconds makes the rate grow linearly from 0 to the level's rate over the first R
seconds. It is done by warping time: unit-mean gaps are drawn in "operational time" and mapped
through the inverse of the cumulative rate, so a ramped schedule and a plain one with the same seed
draw the same random numbers.

Schedules are plain lists of offsets (seconds from the level's start). Anything that can produce
such a list (a trace replay, a split of one schedule over several client processes) can hand it to
the open-loop sender (k2bench.harness.load.openloop) directly. The draws are prefix-stable: the
first m offsets of a longer schedule are the schedule of m requests with the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

_CHUNK = 1024  # gaps drawn at a time (numpy's gamma draws are sequential, so chunks keep prefixes stable)


def check(rate: float, burstiness: float = 1.0, ramp_up_s: float = 0.0) -> None:
    """ValueError for a schedule that cannot be drawn (the settings turn it into a user error first)."""
    if not rate > 0:  # also refuses NaN
        raise ValueError(f"rate must be positive (or inf), not {rate!r}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a positive number, not {burstiness!r}")
    if not (ramp_up_s >= 0 and math.isfinite(ramp_up_s)):
        raise ValueError(f"ramp-up must be 0 or more seconds, not {ramp_up_s!r}")


def _operational_times(burstiness: float, seed: int) -> Iterator[float]:
    """0, then cumulative sums of unit-mean gamma gaps (shape = burstiness): arrivals of a rate-1 process."""
    rng = np.random.default_rng(seed)
    total = 0.0
    yield total
    while True:
        for gap in rng.gamma(burstiness, 1.0 / burstiness, size=_CHUNK):
            total += float(gap)
            yield total


def _warp(u: float, rate: float, ramp_up_s: float) -> float:
    """The wall-clock offset at which the cumulative expected arrivals reach ``u``.

    Cumulative rate: rate * t^2 / (2 R) during the ramp (t < R), then rate * R / 2 + rate * (t - R)."""
    if ramp_up_s <= 0:
        return u / rate
    during = rate * ramp_up_s / 2
    if u < during:
        return math.sqrt(2 * ramp_up_s * u / rate)
    return ramp_up_s + (u - during) / rate


def arrival_offsets(n: int | None, rate: float, burstiness: float = 1.0, seed: int = 0, ramp_up_s: float = 0.0,
                    duration_s: float | None = None) -> list[float]:
    """Send times (seconds from the level's start, first at 0) of up to ``n`` requests.

    With ``duration_s`` the schedule holds the arrivals before that offset (as many as fit), capped
    by ``n`` when it is given; without it, exactly ``n``. ``rate`` is requests per second (``inf``:
    all at 0); ``burstiness`` the gamma shape K; ``ramp_up_s`` the seconds over which the rate grows
    linearly from 0."""
    check(rate, burstiness, ramp_up_s)
    if n is None and duration_s is None:
        raise ValueError("give a number of requests, a duration, or both")
    if n is not None and n < 0:
        raise ValueError(f"number of requests must be 0 or more, not {n}")
    if duration_s is not None and not (duration_s > 0 and math.isfinite(duration_s)):
        raise ValueError(f"duration must be a positive number of seconds, not {duration_s!r}")
    if math.isinf(rate):
        if n is None:
            raise ValueError("an infinite rate sends everything at once: give a number of requests")
        return [0.0] * n
    out: list[float] = []
    for u in _operational_times(burstiness, seed):
        if n is not None and len(out) >= n:
            break
        t = _warp(u, rate, ramp_up_s)
        if duration_s is not None and t >= duration_s:
            break
        out.append(t)
    return out


def level_seed(seed: int, rate: float, trial: int) -> int:
    """The schedule seed of one level: the run's seed, the level's rate and trial (so levels differ,
    and a rerun with the same seed sends the same schedules)."""
    rate_part = 0 if math.isinf(rate) else int(round(rate * 1000))
    return (seed * 1_000_003 + rate_part * 7919 + trial) % (2**63)


def level_schedule(rate: float, num_prompts: int | None, num_warmup: int, burstiness: float = 1.0, seed: int = 0,
                   ramp_up_s: float = 0.0, duration_s: float | None = None) -> tuple[list[float], int]:
    """(offsets, warmup count) of one rate level: warmup requests first, then the measured ones.

    Warmup is the first ``num_warmup`` arrivals and every arrival during the ramp-up, whichever is
    more. Then ``num_prompts`` measured arrivals, or, with ``duration_s``, those in the ``duration_s``
    seconds after the first measured one (at most ``num_prompts`` when it is given)."""
    if num_prompts is None and duration_s is None:
        raise ValueError("give a number of measured requests, a duration, or both")
    draw = dict(rate=rate, burstiness=burstiness, seed=seed, ramp_up_s=ramp_up_s)
    in_ramp = len(arrival_offsets(None, duration_s=ramp_up_s, **draw)) if ramp_up_s > 0 and math.isfinite(rate) else 0
    warm = max(num_warmup, in_ramp)
    if duration_s is None:
        return arrival_offsets(warm + num_prompts, **draw), warm
    first_measured = arrival_offsets(warm + 1, **draw)[-1]
    cap = None if num_prompts is None else warm + num_prompts
    if math.isinf(rate):
        return arrival_offsets(cap, **draw), warm
    return arrival_offsets(cap, duration_s=first_measured + duration_s, **draw), warm
