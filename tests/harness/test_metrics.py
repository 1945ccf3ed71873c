"""Metric maths on hand-built records; every expected number below was computed by hand."""

from __future__ import annotations

import math

import pytest

from k2bench.errors import UserError
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.metrics import request_metrics, stats, summarize_level

MS = 1_000_000  # ns per ms


def rec(index, send_ms, tokens_ms, out, *, end_ms=None, req_out=None, prompt=None, ok=True, warmup=False,
        error=None, conc=4):
    return RequestRecord(
        index=index, concurrency=conc, warmup=warmup, requested_input_tokens=100,
        requested_output_tokens=req_out if req_out is not None else out if out is not None else 4,
        send_ns=send_ms * MS, token_ns=[t * MS for t in tokens_ms],
        end_ns=None if end_ms is None else end_ms * MS, prompt_tokens=prompt, output_tokens=out,
        success=ok, error=error,
    )


def level():
    """Four measured requests (one failed, one OSL mismatch) plus warmups that must be ignored."""
    return [
        # warmups with absurd stamps: if counted they would change every number below
        rec(0, -5000, [-1000, -10], 2, end_ms=-5, prompt=9999, warmup=True),
        rec(1, -4000, [], None, end_ms=-3900, ok=False, warmup=True, error="warmup failure"),
        # R0: one message carried 2 tokens (5 tokens, 4 messages); usage tail arrives at 170 ms
        rec(2, 0, [100, 120, 150, 160], 5, end_ms=170, prompt=110),
        # R1: server did not report prompt tokens -> requested ISL (100) counts
        rec(3, 10, [60, 80, 100, 120], 4, end_ms=130, prompt=None),
        # R2: failed, no tokens
        rec(4, 20, [], None, end_ms=40, ok=False, error="HTTP 500: boom"),
        # R3: asked for 4 tokens, got 3 (OSL mismatch), finishes last
        rec(5, 30, [130, 140, 150], 3, end_ms=200, req_out=4, prompt=100),
    ]


def test_request_metrics_by_hand():
    m = request_metrics(level()[2])
    assert m["ttft_ms"] == pytest.approx(100.0)
    assert m["e2el_ms"] == pytest.approx(160.0)  # last token message, not the 170 ms usage tail
    assert m["tpot_ms"] == pytest.approx((160 - 100) / (5 - 1))  # uses usage.completion_tokens = 5
    assert m["itl_ms"] == pytest.approx([20.0, 30.0, 10.0])  # 4 messages -> 3 gaps, though 5 tokens


def test_request_metrics_not_applicable():
    failed = request_metrics(level()[4])
    assert failed == {"ttft_ms": None, "tpot_ms": None, "e2el_ms": None, "itl_ms": None}
    one_token = request_metrics(rec(0, 0, [50], 1, end_ms=60))
    assert one_token["ttft_ms"] == pytest.approx(50.0)
    assert one_token["tpot_ms"] is None  # TPOT needs at least two output tokens
    assert one_token["itl_ms"] == []
    no_usage = request_metrics(rec(0, 0, [50, 70], None, end_ms=80, req_out=2))
    assert no_usage["tpot_ms"] is None and no_usage["e2el_ms"] == pytest.approx(70.0)


def test_summarize_counts_and_throughput():
    p = summarize_level(level(), concurrency=4, num_gpus=2, trial=1)
    assert (p["concurrency"], p["trial"]) == (4, 1)
    assert p["num_prompts"] == 4 and p["completed"] == 3 and p["failed"] == 1
    assert p["osl_mismatches"] == 1
    assert p["errors"] == ["HTTP 500: boom"]
    assert p["duration_s"] == pytest.approx(0.200)  # first send (0 ms) to last finish (200 ms)
    assert p["input_tokens"] == 110 + 100 + 100
    assert p["output_tokens"] == 5 + 4 + 3
    assert p["tput_per_gpu"] == pytest.approx(322 / 0.2 / 2)
    assert p["output_tput_per_gpu"] == pytest.approx(12 / 0.2 / 2)
    assert p["input_tput_per_gpu"] == pytest.approx(310 / 0.2 / 2)


def test_num_gpus_scales_per_gpu_throughput_only():
    one = summarize_level(level(), concurrency=4, num_gpus=1)
    four = summarize_level(level(), concurrency=4, num_gpus=4)
    assert one["tput_per_gpu"] == pytest.approx(322 / 0.2)
    assert four["tput_per_gpu"] == pytest.approx(322 / 0.2 / 4)
    assert one["tpot_ms"] == four["tpot_ms"] and one["interactivity"] == four["interactivity"]


def test_latency_statistics_by_hand():
    p = summarize_level(level(), concurrency=4, num_gpus=2)
    # TPOT per request: R0 15, R1 (110-50)/3 = 20, R3 (120-100)/2 = 10 -> sorted 10, 15, 20
    tpot = p["tpot_ms"]
    assert tpot["mean"] == pytest.approx(15.0)
    assert tpot["median"] == pytest.approx(15.0)
    assert tpot["std"] == pytest.approx(math.sqrt(50 / 3))  # population std
    assert tpot["p90"] == pytest.approx(19.0)  # linear: rank 0.9*2 = 1.8 -> 15 + 0.8*5
    assert tpot["p99"] == pytest.approx(19.9)
    assert tpot["p99.9"] == pytest.approx(19.99)
    # TTFT: 100, 50, 100
    assert p["ttft_ms"]["mean"] == pytest.approx(250 / 3)
    assert p["ttft_ms"]["median"] == pytest.approx(100.0)
    # E2EL: 160, 110, 120 -> sorted 110, 120, 160; p90 rank 1.8 -> 120 + 0.8*40
    assert p["e2el_ms"]["median"] == pytest.approx(120.0)
    assert p["e2el_ms"]["p90"] == pytest.approx(152.0)
    # ITL gaps pooled: 20,30,10 | 20,20,20 | 10,10 -> sorted 10,10,10,20,20,20,20,30
    itl = p["itl_ms"]
    assert itl["mean"] == pytest.approx(140 / 8)
    assert itl["median"] == pytest.approx(20.0)
    assert itl["p90"] == pytest.approx(23.0)  # rank 6.3 -> 20 + 0.3*10
    assert itl["p99"] == pytest.approx(29.3)
    assert itl["p99.9"] == pytest.approx(29.93)


def test_interactivity_maps_tpot_percentiles():
    p = summarize_level(level(), concurrency=4, num_gpus=2)
    assert p["interactivity"]["median"] == pytest.approx(1000 / 15)
    assert p["interactivity"]["p90"] == pytest.approx(1000 / 19.0)
    assert p["interactivity"]["p99"] == pytest.approx(1000 / 19.9)
    assert p["interactivity"]["p90"] < p["interactivity"]["median"]  # a tail: slower users


def test_all_failed_level_has_counts_but_no_latencies():
    recs = [rec(i, i, [], None, end_ms=i + 5, ok=False, error=f"err {i}", req_out=4) for i in range(7)]
    p = summarize_level(recs, concurrency=8, num_gpus=1)
    assert p["completed"] == 0 and p["failed"] == 7
    assert p["errors"] == [f"err {i}" for i in range(5)]  # first few kept, in index order
    assert p["tput_per_gpu"] == 0.0
    assert all(v is None for v in p["ttft_ms"].values())
    assert p["interactivity"] == {"median": None, "p90": None, "p99": None}


def test_stats_empty_and_single():
    assert stats([]) == {k: None for k in ("mean", "median", "std", "p90", "p99", "p99.9")}
    assert stats([7.0]) == {"mean": 7.0, "median": 7.0, "std": 0.0, "p90": 7.0, "p99": 7.0, "p99.9": 7.0}


@pytest.mark.parametrize("gpus", [0, -1, 1.5, True])
def test_bad_num_gpus_is_user_error(gpus):
    with pytest.raises(UserError, match="num_gpus"):
        summarize_level(level(), concurrency=4, num_gpus=gpus)


def test_pooled_itl_equals_per_request_gaps():
    recs = level()
    p = summarize_level(recs, concurrency=4, num_gpus=1)
    pooled = [g for r in recs if r.success and not r.warmup for g in request_metrics(r)["itl_ms"]]
    assert p["itl_ms"] == stats(pooled)
    assert request_metrics(recs[2], with_itl=False)["itl_ms"] is None
