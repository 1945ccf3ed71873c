"""Whether a measured level may enter the history, and why not.

A level is valid when none of its measured requests failed (or no more than ``--max-failure-rate``
of them), none timed out, every output had the requested length (unless ``--allow-osl-mismatch``),
it was not cut short, and the client was not the bottleneck: its busiest event loop used no more than
``--max-client-cpu`` of a core and ran callbacks no later than ``--max-loop-lag-ms`` at p99 (levels
whose measured window is under a second are not judged on this) (see k2bench.harness.load.selfmeasure; docs/harness.md, "The client's own
load"). A rate level must also have kept its schedule: its achieved rate within
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

MIN_JUDGED_S = 1.0  # the client is judged over a measured window at least this long (see client_bottleneck)


@dataclass(frozen=True)
class ValidityRules:
    max_failure_rate: float = 0.0  # as MLPerf treats errors: any failure invalidates the level
    allow_osl_mismatch: bool = False
    # Above 90% of a core a single-threaded loop's waits grow steeply (u / (1 - u) service times: 9 at
    # 0.9); genai-bench warns at the same mark.
    max_client_cpu: float = 0.9
    # A p99 callback delay of 50 ms is a stalled loop, not jitter: longer than a real server's decode step
    # (10-50 ms), so at p99 stamps land a whole step late and ITL/TTFT tails are the client's. Lower
    # bounds flagged levels on a shared 2-core machine at load 10 whose CPU figures were fine.
    max_loop_lag_ms: float = 50.0
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
        if not self.max_client_cpu > 0:
            raise UserError(f"--max-client-cpu must be a positive fraction of a core, not {self.max_client_cpu:g}")
        if not self.max_loop_lag_ms > 0:
            raise UserError(f"--max-loop-lag-ms must be positive, not {self.max_loop_lag_ms:g}")


def client_bottleneck(client: dict | None, rules: ValidityRules) -> str | None:
    """Why the client, not the server, set the level's pace (None when it did not, or was not measured).

    Judged on the busiest loop's CPU and the worst loop's lag, and only over a measured window of at least
    MIN_JUDGED_S: over a shorter one both figures come from a handful of samples, and one scheduling hiccup
    of a busy machine decides them. Run-queue wait (``demand_max``) is kept for reading, not judged: on a
    shared machine it measures the neighbours; a loop they starve shows as lag."""
    if not client or client.get("wall_s", 0.0) < MIN_JUDGED_S:
        return None
    reasons = []
    if client["busy_max"] > rules.max_client_cpu:
        reasons.append(f"its busiest event loop used {client['busy_max']:.0%} of a core (> --max-client-cpu "
                       f"{rules.max_client_cpu:g})")
    if client["lag_p99_ms"] > rules.max_loop_lag_ms:
        reasons.append(f"its event loop ran callbacks {client['lag_p99_ms']:.1f} ms late at p99 (> "
                       f"--max-loop-lag-ms {rules.max_loop_lag_ms:g})")
    if not reasons:
        return None
    more = "" if client["processes"] >= client["cores_available"] else "; more --client-procs may help"
    return "the client was the bottleneck: " + " and ".join(reasons) + more


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
    client = client_bottleneck(point.get("client"), rules)
    if client:
        reasons.append(client)
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
