"""The server-side time split and speculation figures, from a hand-written pair of vLLM /metrics scrapes
(tests/harness/fixtures/vllm_scrapes: vLLM's metric names, buckets and labels; the window holds 10
requests whose bucket counts, sums and spec-decode counters were chosen so every figure is worked out
by hand below), and the histogram arithmetic on small cases."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from k2bench.harness.telemetry import histograms, server_split
from k2bench.harness.telemetry import server_metrics as sm

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm_scrapes"


def window() -> dict:
    first = sm.parse((FIXTURES / "before.prom").read_text())
    last = sm.parse((FIXTURES / "after.prom").read_text())
    return sm.summarize(first, last, [])


def test_split_from_vllm_scrapes_matches_the_hand_computation():
    out = window()
    # buckets never leak into the counters; the histograms are kept as the window's deltas
    assert not any("_bucket" in k or " le=" in k for k in out["counters"])
    q = out["histograms"]['vllm:request_queue_time_seconds{engine="0",model_name="kimi"}']
    assert q["cum"][:4] == [4, 8, 10, 10] and q["cum"][-1] == 10 and q["sum"] == pytest.approx(3.6)
    split = server_split.phase_split(out)
    # queue: 4 in (0, 0.3], 4 in (0.3, 0.5], 2 in (0.5, 0.8]; sum 3.6 s
    assert split["queue"]["mean_ms"] == pytest.approx(360.0)
    assert split["queue"]["median_ms"] == pytest.approx(300 + 200 * 1 / 4)  # rank 5: 1 of 4 into (0.3, 0.5]
    assert split["queue"]["median_bucket_ms"] == pytest.approx([300.0, 500.0])
    assert split["queue"]["p99_ms"] == pytest.approx(500 + 300 * 1.9 / 2)  # rank 9.9: 1.9 of 2 into (0.5, 0.8]
    # prefill: 7 in (0.5, 0.8], 3 in (0.8, 1.0]; sum 6.1 s
    assert split["prefill"]["mean_ms"] == pytest.approx(610.0)
    assert split["prefill"]["median_ms"] == pytest.approx(500 + 300 * 5 / 7)
    assert split["prefill"]["p99_ms"] == pytest.approx(800 + 200 * 2.9 / 3)
    # decode: 4 in (1.5, 2.0], 6 in (2.0, 2.5]; inference: 10 in (2.0, 2.5]
    assert split["decode"]["mean_ms"] == pytest.approx(1700.0)
    assert split["decode"]["median_ms"] == pytest.approx(2000 + 500 * 1 / 6)
    assert split["inference"]["median_ms"] == pytest.approx(2250.0)
    assert split["inference"]["p99_ms"] == pytest.approx(2495.0)
    assert split["queue"]["count"] == 10 and split["queue"]["family"] == "vllm:request_queue_time_seconds"

    flat = server_split.level_figures(out)
    assert flat["server_queue_ms"] == {"mean": 360.0, "median": 350.0, "p99": 785.0}
    assert flat["server_ttft_ms"] == pytest.approx(970.0)  # queue + prefill means
    assert flat["server_inference_ms"]["mean"] == pytest.approx(610.0 + 1700.0)  # the fixture is consistent


def test_speculation_from_vllm_counters():
    spec = server_split.speculation(window())
    # window: 400 drafts of 3 tokens (1200), 720 accepted: 1 + 720 / 400 per step, 720 / 1200 of drafts
    assert spec["drafts"] == 400 and spec["draft_tokens"] == 1200 and spec["accepted_tokens"] == 720
    assert spec["accept_len"] == pytest.approx(2.8)
    assert spec["accept_rate"] == pytest.approx(0.6)
    flat = server_split.level_figures(window())
    assert flat["spec_accept_len"] == pytest.approx(2.8) and flat["spec_accept_rate"] == pytest.approx(0.6)


def test_sglang_speculation_is_the_gauges_window_mean():
    first = {'sglang:spec_accept_length{model_name="m"}': ("gauge", 3.0),
             'sglang:spec_accept_rate{model_name="m"}': ("gauge", 0.5)}
    last = {'sglang:spec_accept_length{model_name="m"}': ("gauge", 3.4),
            'sglang:spec_accept_rate{model_name="m"}': ("gauge", 0.7)}
    spec = server_split.speculation(sm.summarize(first, last, []))
    assert spec["accept_len"] == pytest.approx(3.2) and spec["accept_rate"] == pytest.approx(0.6)


def test_a_server_without_speculation_or_histograms_gives_none():
    out = sm.summarize({"vllm:prompt_tokens_total": ("counter", 1.0)}, {"vllm:prompt_tokens_total": ("counter", 9.0)}, [])
    assert server_split.speculation(out) is None and server_split.phase_split(out) is None
    flat = server_split.level_figures(None)
    assert all(v is None for v in flat.values())


def test_quantile_interpolates_within_the_bucket_and_names_it():
    d = histograms.Delta(le=(0.1, 0.2, 0.4), cum=(2, 6, 8, 9), sum=2.0)
    assert histograms.quantile(d, 0.5) == pytest.approx((0.1 + 0.1 * 2.5 / 4, 0.1, 0.2))
    # rank 8.91 is in +Inf: the highest finite bound, a lower bound on the truth
    assert histograms.quantile(d, 0.99) == (0.4, 0.4, math.inf)
    assert histograms.quantile(histograms.Delta((1.0,), (0, 0), 0.0), 0.5) is None
    # the lowest bucket starts at 0
    assert histograms.quantile(histograms.Delta((1.0,), (4, 4), 2.0), 0.5) == pytest.approx((0.5, 0.0, 1.0))


def test_a_histogram_that_went_backwards_is_left_out_and_noted():
    key = 'x_seconds{a="b"}'
    first = {histograms.bucket_key(key, "1.0"): ("bucket", 5.0), histograms.bucket_key(key, "+Inf"): ("bucket", 5.0)}
    last = {histograms.bucket_key(key, "1.0"): ("bucket", 1.0), histograms.bucket_key(key, "+Inf"): ("bucket", 1.0)}
    out = sm.summarize(first, last, [])
    assert "histograms" not in out and key in out["note"]


def test_series_of_one_family_are_pooled_and_instances_add():
    def doc(cum, s):
        return {"le": [1.0, 2.0], "cum": cum, "sum": s}
    one = {"histograms": {'vllm:request_queue_time_seconds{engine="0"}': doc([2, 2, 2], 1.0),
                          'vllm:request_queue_time_seconds{engine="1"}': doc([0, 2, 2], 3.0)}}
    q = server_split.phase_split(one)["queue"]
    assert q["count"] == 4 and q["mean_ms"] == pytest.approx(1000.0) and q["median_ms"] == pytest.approx(1000.0)
    two = {"histograms": {'vllm:request_queue_time_seconds{instance="p:1"}': doc([2, 2, 2], 1.0),
                          'vllm:request_queue_time_seconds{instance="d:2"}': doc([0, 2, 2], 3.0)}}
    q = server_split.phase_split(two)["queue"]
    # each request passed both workers: 0.5 s + 1.5 s on average
    assert q["mean_ms"] == pytest.approx(2000.0) and q["median_ms"] == pytest.approx(500.0 + 1500.0)


def test_stored_form_is_trimmed_and_reads_the_same():
    d = histograms.Delta(le=(0.1, 0.2, 0.4, 0.8, 1.6), cum=(0, 0, 3, 5, 5, 5), sum=1.5)
    doc = d.to_json()
    assert doc["le"] == [0.2, 0.4, 0.8] and doc["cum"] == [0, 3, 5, 5]  # the bound below, and up to the total
    back = histograms.Delta.from_json(doc)
    for q in (0.01, 0.5, 0.6, 0.99, 1.0):
        assert histograms.quantile(back, q) == pytest.approx(histograms.quantile(d, q))
    empty = histograms.Delta(le=(0.1, 0.2), cum=(0, 0, 0), sum=0.0)
    assert histograms.quantile(histograms.Delta.from_json(empty.to_json()), 0.5) is None
    spill = histograms.Delta(le=(0.1, 0.2), cum=(0, 1, 3), sum=1.0)  # two in +Inf
    assert histograms.quantile(histograms.Delta.from_json(spill.to_json()), 0.99) == (0.2, 0.2, math.inf)


def test_two_endpoints_on_one_host_and_port_keep_both_windows():
    from k2bench.harness.telemetry.level import LevelTelemetry, TelemetryConfig

    urls = ("http://127.0.0.1:9/a/metrics", "http://127.0.0.1:9/b/metrics")
    tel = LevelTelemetry(TelemetryConfig(gpu=False, metrics_urls=urls), base_url="http://127.0.0.1:9",
                         server_env={}, hardware=None)
    assert list(tel.metrics) == list(urls)  # not one window under "127.0.0.1:9"
    assert set(tel.run_meta()["notes"]) >= {f"server_metrics:{u}" for u in urls}  # neither answers: one note each
    tel.close()


def test_merged_windows_label_every_sample_and_split_by_instance():
    """The fixture's window as a prefill worker's and a decode worker's (the same numbers on both): every
    key gains its instance label after its own labels, and each phase is the two workers' sum."""
    one = window()
    merged = sm.merge({"10.0.0.1:8100": one, "10.0.0.2:8200": one})
    assert merged["instances"] == ["10.0.0.1:8100", "10.0.0.2:8200"]
    assert 'vllm:prompt_tokens_total{engine="0",model_name="kimi",instance="10.0.0.2:8200"}' in merged["counters"]
    assert sm.with_label("x_total", "instance", "h:1") == 'x_total{instance="h:1"}'
    split = server_split.phase_split(merged)
    assert split["queue"]["mean_ms"] == pytest.approx(2 * 360.0) and split["queue"]["count"] == 10
    assert split["prefill"]["median_bucket_ms"] == pytest.approx([2 * 500.0, 2 * 800.0])
    # counters add over workers: the speculation figures of two equal workers are those of one
    assert server_split.speculation(merged)["accept_len"] == pytest.approx(2.8)
