"""Whether a measured level may enter the history, and why not.

A level is valid when none of its measured requests failed (or no more than ``--max-failure-rate``
of them), none timed out, every output had the requested length (unless ``--allow-osl-mismatch``),
and it was not cut short. An invalid level is still stored, records and all, with its reason, but
frontiers, the gate, change points and the dashboard's default views leave it out: a level
summarised from the few requests that finished before a server died is not a data point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from k2bench.errors import UserError
from k2bench.harness.load.level_watch import timed_out
from k2bench.harness.load.records import RequestRecord


@dataclass(frozen=True)
class ValidityRules:
    max_failure_rate: float = 0.0  # as MLPerf treats errors: any failure invalidates the level
    allow_osl_mismatch: bool = False

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
    return (not reasons, "; ".join(reasons) or None)
