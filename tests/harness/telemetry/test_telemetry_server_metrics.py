"""Server metrics over a window: against a real prometheus_client endpoint (counters, labelled samples,
histograms, gauges), scripted scrapes for the gauge summary and counter resets, and a server
without /metrics."""

from __future__ import annotations

import http.server
import threading

import pytest
from conftest import free_port
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from k2bench.harness.telemetry import server_metrics as sm


@pytest.fixture
def endpoint():
    reg = CollectorRegistry()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    yield reg, f"http://127.0.0.1:{port}/v1"
    server.shutdown()
    thread.join()


def test_a_window_over_a_real_prometheus_endpoint(endpoint):
    reg, base = endpoint
    prompt = Counter("vllm:prompt_tokens", "prompt tokens", ["model_name"], registry=reg)
    finished = Counter("vllm:request_success", "finished", ["finished_reason"], registry=reg)
    kv = Gauge("vllm:kv_cache_usage_perc", "kv", registry=reg)
    ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", buckets=(0.1, 1.0), registry=reg)
    prompt.labels("m").inc(5000)  # before the window: must not count
    finished.labels("length").inc(7)
    kv.set(0.25)

    w = sm.ServerMetricsWindow(base, hz=1000.0)
    assert w.begin() is True
    prompt.labels("m").inc(8192 * 3)
    finished.labels("length").inc(3)
    finished.labels("stop").inc(2)  # a label set born inside the window counts from 0
    ttft.observe(0.5)
    ttft.observe(1.5)
    kv.set(0.75)
    out = w.end()

    assert out["counters"]['vllm:prompt_tokens_total{model_name="m"}'] == 8192 * 3
    assert out["counters"]['vllm:request_success_total{finished_reason="length"}'] == 3
    assert out["counters"]['vllm:request_success_total{finished_reason="stop"}'] == 2
    assert out["counters"]["vllm:time_to_first_token_seconds_count"] == 2
    assert out["counters"]["vllm:time_to_first_token_seconds_sum"] == pytest.approx(2.0)
    assert not any("_bucket" in k or "_created" in k for k in out["counters"])
    g = out["gauges"]["vllm:kv_cache_usage_perc"]
    assert g["max"] == 0.75 and 0.25 <= g["mean"] <= 0.75
    assert out["scrapes"] >= 2 and "note" not in out
    raw = out["raw"]
    assert len(raw["t_s"]) == out["scrapes"] and raw["t_s"][0] == 0.0
    assert raw["gauges"]["vllm:kv_cache_usage_perc"][0] == 0.25 and raw["gauges"]["vllm:kv_cache_usage_perc"][-1] == 0.75


def test_gauges_mean_and_max_over_every_scrape_and_counter_resets():
    first = {"running": ("gauge", 0.0), "tokens_total": ("counter", 100.0), "restarts_total": ("counter", 50.0)}
    middle = [{"running": ("gauge", 4.0)}]
    last = {"running": ("gauge", 8.0), "tokens_total": ("counter", 400.0), "restarts_total": ("counter", 2.0)}
    out = sm.summarize(first, last, middle, times=[10.0, 11.0, 12.5])
    assert out["gauges"] == {"running": {"mean": 4, "max": 8}}
    assert out["raw"] == {"t_s": [0.0, 1.0, 2.5], "gauges": {"running": [0.0, 4.0, 8.0]}}
    assert out["counters"] == {"tokens_total": 300}
    assert "restarts_total" in out["note"] and out["scrapes"] == 3


def test_no_metrics_endpoint_is_noted_once_and_the_window_is_empty():
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        w = sm.ServerMetricsWindow(f"http://127.0.0.1:{srv.server_address[1]}")
        assert w.begin() is False and w.end() is None
        assert w.note == f"server metrics off: http://127.0.0.1:{srv.server_address[1]}/metrics answered HTTP 404"
        assert w.begin() is False  # not retried level after level
    finally:
        srv.shutdown()
        t.join()
    refused = sm.ServerMetricsWindow(f"http://127.0.0.1:{free_port()}")
    assert refused.begin() is False and refused.note.startswith("server metrics off:")


def test_text_that_is_not_prometheus_is_a_scrape_error():
    with pytest.raises(sm.ScrapeError, match="not Prometheus text"):
        sm.parse("<html>hello</html>\n")
