"""Whether a measured level may enter the history, and why not.

A level is valid when none of its measured requests failed (or no more than ``--max-failure-rate``
of them), none timed out, every output had the requested length (unless ``--allow-osl-mismatch``),
and it was not cut short. A rate level must also have kept its schedule: its achieved rate within
``--max-rate-error`` of the rate its schedule asked for, and its p99 send lag at most ``--max-send-lag``
ms (docs/concepts.md defines both). An invalid level is still stored, records and all, with its reason, but
frontiers, the gate, change points and the dashboard's default views leave it out: a level
summarised from the few requests that finished before a server died is not a data point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from k2bench.errors import UserError
from k2bench.harness.load.level_watch import timed_out
from k2bench.harness.load.records import RequestRecord


@dataclass(frozen=True)
class ValidityRules:
    max_failure_rate: float = 0.0  # as MLPerf treats errors: any failure invalidates the level
    allow_osl_mismatch: bool = False
    # Rate levels. The achieved rate is held against the rate of the level's own schedule (not the
    # asked rate: a short Poisson schedule's own rate is off by about 1/sqrt(n), which is not the
    # client's fault); 5% is well above what a client that keeps pace misses by (send lags are
    # milliseconds against gaps of tens of ms or more). A p99 send lag of 50 ms is a client that fell
    # behind: at 20 req/s that is a whole gap, and it is far above a healthy event loop's ~1 ms.
    max_rate_error: float = 0.05
    max_send_lag_ms: float = 50.0

    def validate(self) -> None:
        if not 0 <= self.max_failure_rate < 1:
            raise UserError(f"--max-failure-rate must be at least 0 and below 1 (a fraction of the level's "
                            f"requests), not {self.max_failure_rate:g}")


def judge_level(point: dict, records: Sequence[RequestRecord], rules: ValidityRules, *, planned: int,
                stopped: str | None = None) -> tuple[bool, str | None]:
    """(valid, invalid_reason) of one summarised level; ``planned`` measured requests were asked for
    and ``stopped`` says why the level ended early, if it did."""
    reasons = []
    if stopped:
        reasons.append(f"stopped after {point['num_prompts']} of {planned} requests: {stopped}")
    timeouts = sum(1 for r in records if not r.warmup and timed_out(r))
    if timeouts:
        reasons.append(f"{timeouts} request(s) timed out")
    failed, sent = point["failed"], point["num_prompts"]
    if failed and failed > rules.max_failure_rate * sent:
        reasons.append(f"{failed} of {sent} requests failed ({failed / sent:.0%} > --max-failure-rate "
                       f"{rules.max_failure_rate:g})")
    mismatches = point.get("osl_mismatches") or 0
    if mismatches and not rules.allow_osl_mismatch:
        reasons.append(f"{mismatches} output(s) differed from the requested length (--allow-osl-mismatch "
                       f"accepts them)")
    if point.get("mode") == "rate":
        reasons.extend(_schedule_kept(point, records, rules))
    return (not reasons, "; ".join(reasons) or None)


def _schedule_kept(point: dict, records: Sequence[RequestRecord], rules: ValidityRules) -> list[str]:
    """Why a rate level did not send on its schedule (nothing when it did)."""
    from k2bench.harness.load.openloop import scheduled_rate

    out = []
    asked, achieved = scheduled_rate(records), point.get("achieved_rate")
    if asked is not None and math.isfinite(asked) and achieved is not None \
            and abs(achieved - asked) > rules.max_rate_error * asked:
        out.append(f"achieved rate {achieved:.3g} req/s missed the schedule's {asked:.3g} req/s by more than "
                   f"--max-rate-error {rules.max_rate_error:g}")
    lag = point.get("send_lag_p99_ms")
    if lag is not None and lag > rules.max_send_lag_ms:
        out.append(f"the client fell behind: p99 send lag {lag:.1f} ms > --max-send-lag {rules.max_send_lag_ms:g} ms")
    return out
