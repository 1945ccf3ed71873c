"""Steady state and slices against hand-computed levels (k2bench.harness.measure.steady)."""

from __future__ import annotations

import pytest

from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.measure.steady import summarize_steady, window

S = 1_000_000_000
T0 = 100 * S  # monotonic stamps start anywhere; 0 means "never sent" in a record


def rec(i: int, send_s: float, first_s: float, gap_s: float, n: int, isl: int = 10) -> RequestRecord:
    tokens = [T0 + int((first_s + k * gap_s) * S) for k in range(n)]
    return RequestRecord(index=i, concurrency=4, warmup=False, requested_input_tokens=isl, requested_output_tokens=n,
                         send_ns=T0 + int(send_s * S), token_ns=tokens, end_ns=tokens[-1] + 1000, prompt_tokens=isl,
                         output_tokens=n, success=True)


def staircase() -> list[RequestRecord]:
    """Concurrency 4: three requests start at 0 s, the fourth at 1 s (the ramp); all four run until 5 s,
    then they end one a second (the drain). Each sends its first token 0.1 s after sending and then one a
    0.1 s until it ends."""
    recs = []
    for i, (send, end) in enumerate([(0, 5), (0, 6), (0, 7), (1, 8)]):
        n = round((end - send - 0.1) / 0.1) + 1
        recs.append(rec(i, send, send + 0.1, 0.1, n))
    return recs


def test_window_is_where_ninety_percent_are_in_flight():
    # ceil(0.9 x 4) = 4 in flight: from the fourth send (1 s) to the first end (5 s)
    a, b = window(staircase(), 4)
    assert a - T0 == 1 * S
    assert b - T0 == pytest.approx(5 * S, abs=2000)
    # ceil(0.9 x 3) = 3: from 0 s to the second end (6 s)
    a, b = window(staircase(), 3)
    assert a == T0 and b - T0 == pytest.approx(6 * S, abs=2000)


def test_steady_figures_by_hand():
    out = summarize_steady(staircase(), concurrency=4, num_gpus=2)
    span = out["steady_duration_s"]
    assert span == pytest.approx(4.0, abs=1e-5)
    # tokens with stamps in [1 s, 5 s]: each of the three early requests has one every 0.1 s from 0.1 s,
    # so 1.0, 1.1, ..., 5.0 (41 each, the first request's last token is at 5.0); the fourth: 1.1 .. 5.0 (40)
    out_tokens = 3 * 41 + 40
    in_tokens = 10  # only the fourth request's first token (1.1 s) lies in the window
    assert out["steady_output_tput_per_gpu"] == pytest.approx(out_tokens / span / 2, rel=1e-4)
    assert out["steady_tput_per_gpu"] == pytest.approx((out_tokens + in_tokens) / span / 2, rel=1e-4)
    # no request was sent and finished inside the window: no TPOT; the gaps inside are all 100 ms
    assert out["steady_tpot_ms"]["median"] is None
    assert out["steady_itl_ms"]["median"] == pytest.approx(100.0, abs=1e-3)
    assert out["steady"]["start_s"] == 1.0 and out["steady"]["end_s"] == pytest.approx(5.0, abs=1e-5)


def test_slices_by_hand():
    sl = summarize_steady(staircase(), concurrency=4, num_gpus=1)["steady"]["slices"]
    assert sl["t_s"][:3] == [0.0, 1.0, 2.0] and len(sl["t_s"]) == 9  # 0 .. 8.0000x s
    # 0-1 s: three requests in flight throughout, tokens at 0.1 .. 0.9 s each (the one at 1.0 s is the next slice's)
    assert sl["in_flight"][0] == pytest.approx(3.0, rel=1e-6)
    assert sl["output_tok_s"][0] == pytest.approx(27.0)
    assert sl["in_flight"][2] == pytest.approx(4.0, rel=1e-6) and sl["output_tok_s"][2] == pytest.approx(40.0)
    # the drain: 6-7 s has two requests in flight (the third ends at 7.0 s)
    assert sl["in_flight"][6] == pytest.approx(2.0, rel=1e-5)
    assert all(t == pytest.approx(100.0) for t in sl["tpot_ms"] if t is not None)


def test_tpot_over_window_uses_requests_inside_it():
    recs = staircase() + [rec(4, 1.5, 1.6, 0.05, 11)]  # a fifth request inside 1.5 .. 2.1 s, 50 ms per token
    out = summarize_steady(recs, concurrency=4, num_gpus=1)
    assert out["steady_tpot_ms"]["median"] == pytest.approx(50.0, abs=1e-3)


def test_level_that_never_reaches_the_threshold_has_no_window():
    out = summarize_steady(staircase()[:2], concurrency=4, num_gpus=1)
    assert out["steady_tput_per_gpu"] is None and out["steady"]["start_s"] is None
    assert out["steady"]["slices"]["output_tok_s"]  # the slices are still there


def test_summarize_level_carries_the_steady_fields():
    point = summarize_level(staircase(), concurrency=4, num_gpus=1)
    assert point["steady_duration_s"] == pytest.approx(4.0, abs=1e-5)
    # whole level: 8.0 s from first send to last end, against 4 s of steady state
    assert point["duration_s"] == pytest.approx(8.0, abs=1e-5)
