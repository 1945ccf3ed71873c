"""Validity of rate levels: a level whose client fell behind its schedule is stored invalid, with the reason."""

from __future__ import annotations

from k2bench.harness.load import openloop
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.measure.validity import ValidityRules, judge_level

MS = 1_000_000


def records(gap_ms: float, lag_ms: list[float], queue_ms: float = 0.0) -> list[RequestRecord]:
    """Requests intended every ``gap_ms`` and sent ``lag_ms[i]`` (+ queue) late, with plain token stamps."""
    out = []
    for i, lag in enumerate(lag_ms):
        intended = 10**12 + int(i * gap_ms * MS)
        send = intended + int((lag + queue_ms) * MS)
        out.append(RequestRecord(index=i, concurrency=8, warmup=False, requested_input_tokens=8,
                                 requested_output_tokens=4, send_ns=send,
                                 token_ns=[send + 20 * MS + j * 5 * MS for j in range(4)], end_ns=send + 40 * MS,
                                 prompt_tokens=8, output_tokens=4, success=True, mode="rate", rate=1000 / gap_ms,
                                 intended_ns=intended, queue_ns=int(queue_ms * MS)))
    return out


def judge(recs: list[RequestRecord], rules: ValidityRules = ValidityRules()) -> tuple[bool, str | None]:
    point = summarize_level(recs, concurrency=8, num_gpus=1)
    point.update(openloop.level_figures(recs, recs[0].rate))
    return judge_level(point, recs, rules, planned=len(recs))


def test_a_client_that_kept_its_schedule_is_valid() -> None:
    assert judge(records(50, [0.5] * 40)) == (True, None)


def test_a_client_that_fell_behind_is_invalid_with_the_reason() -> None:
    # the lag grows by 5 ms a request: by the end it is ~200 ms behind and sends ~10% slower than asked
    valid, reason = judge(records(50, [5.0 * i for i in range(40)]))
    assert not valid
    assert "the client fell behind: p99 send lag" in reason and "--max-send-lag 50 ms" in reason
    assert "missed the schedule's 20 req/s" in reason


def test_queue_time_under_the_cap_is_not_send_lag() -> None:
    """Held back by --max-inflight, a request is late by design: its wait is queue time, not the client's lag."""
    recs = records(50, [0.5] * 40, queue_ms=300)
    valid, reason = judge(recs)
    assert valid, reason
    figures = openloop.level_figures(recs, 20.0)
    assert figures["queue_p99_ms"] == 300 and figures["send_lag_p99_ms"] < 1


def test_the_tolerances_are_flags() -> None:
    recs = records(50, [5.0 * i for i in range(40)])
    assert judge(recs, ValidityRules(max_rate_error=0.5, max_send_lag_ms=1000)) == (True, None)
