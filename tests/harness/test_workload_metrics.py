"""Hit rate and per-turn figures from hand-made records and server windows (k2bench.harness.measure.workload_metrics)."""

from __future__ import annotations

import pytest

from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure import workload_metrics as wm


def rec(prompt: int, cached: int | None, turn: int | None = None, ttft_ms: float = 10.0, ok: bool = True,
        warmup: bool = False) -> RequestRecord:
    return RequestRecord(index=0, concurrency=1, warmup=warmup, requested_input_tokens=prompt,
                         requested_output_tokens=2, send_ns=1_000_000, token_ns=[1_000_000 + int(ttft_ms * 1e6)],
                         prompt_tokens=prompt, output_tokens=2, success=ok, cached_tokens=cached, turn=turn)


def test_usage_hit_rate_is_token_weighted_over_successful_requests() -> None:
    records = [rec(100, 50), rec(300, 0), rec(100, None), rec(100, 100, ok=False)]
    assert wm.hit_rate_from_usage(records) == pytest.approx(50 / 400)
    assert wm.hit_rate_from_usage([rec(10, None)]) is None


@pytest.mark.parametrize("window, expected", [
    ({"counters": {"k2bench_prefix_cache_hits_total": 30, "k2bench_prefix_cache_queries_total": 120}},
     (0.25, "k2bench_prefix_cache")),
    ({"counters": {'vllm:prefix_cache_hits_total{engine="0",model_name="m"}': 10,
                   'vllm:prefix_cache_hits_total{engine="1",model_name="m"}': 30,
                   'vllm:prefix_cache_queries_total{engine="0",model_name="m"}': 50,
                   'vllm:prefix_cache_queries_total{engine="1",model_name="m"}': 50}}, (0.4, "vllm:prefix_cache")),
    ({"counters": {}, "gauges": {'sglang:cache_hit_rate{model_name="m"}': {"mean": 0.7, "max": 0.9}}},
     (0.7, "sglang:cache_hit_rate")),
    ({"counters": {"k2bench_prefix_cache_hits_total": 0, "k2bench_prefix_cache_queries_total": 0}}, (None, None)),
    (None, (None, None)),
])
def test_server_hit_rate_from_counters_or_gauge(window, expected) -> None:
    rate, source = wm.hit_rate_from_server(window)
    assert (rate if rate is None else pytest.approx(rate), source) == (
        expected[0] if expected[0] is None else pytest.approx(expected[0]), expected[1])


def test_server_figure_replaces_usage_only_where_it_has_one() -> None:
    point = {"prefix_hit_rate": 0.1, "prefix_hit_source": wm.USAGE_SOURCE, "server_metrics": {"counters": {}}}
    wm.prefer_server(point)
    assert point["prefix_hit_rate"] == 0.1
    point["server_metrics"] = {"counters": {"k2bench_prefix_cache_hits_total": 5,
                                            "k2bench_prefix_cache_queries_total": 10}}
    wm.prefer_server(point)
    assert (point["prefix_hit_rate"], point["prefix_hit_source"]) == (0.5, "k2bench_prefix_cache")


def test_per_turn_figures() -> None:
    records = [rec(10, 0, turn=1, ttft_ms=20), rec(10, 0, turn=1, ttft_ms=40), rec(30, 20, turn=2, ttft_ms=5),
               rec(30, 30, turn=2, ttft_ms=7, ok=False)]
    turns = wm.per_turn(records)
    assert sorted(turns) == ["1", "2"]
    assert turns["1"]["requests"] == 2 and turns["1"]["ttft_ms_median"] == pytest.approx(30)
    assert turns["2"]["requests"] == 1 and turns["2"]["hit_rate"] == pytest.approx(20 / 30)
    assert wm.per_turn([rec(10, 0)]) is None
