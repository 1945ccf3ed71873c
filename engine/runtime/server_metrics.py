"""The server's /metrics through prometheus_client: engine counters and gauges read at scrape time,
and the latency histograms operators expect, named as vLLM names them (with the k2bench_ prefix).

Counters and gauges are owned by the engine thread (EngineStats, the scheduler); a collector reads
them when scraped, so the engine keeps plain integers and no lock is taken per step. Histograms
are observed by the HTTP handler, from the engine's own clock (a Sequence's arrival and first
scheduling) and the moments its tokens reach the handler. One registry per server, so several
servers in one process (tests) never share a metric.
"""

from __future__ import annotations

import gc
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from k2bench.engine.runtime.sequence import Sequence

PREFIX = "k2bench_"
# seconds; decode steps of a tiny CPU model are a few ms, prefills of 8k tokens on a big MoE many seconds
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class _EngineCollector(Collector):
    def __init__(self, engine, stalls=None) -> None:
        self.engine = engine
        self.stalls = stalls  # server_process.Stalls, where the serving process counts them

    def collect(self):
        eng = self.engine
        sch, st = eng.scheduler, eng.stats
        gauges = [
            ("num_requests_running", "requests in the running batch", len(sch.running)),
            ("num_requests_waiting", "requests waiting for admission", len(sch.waiting)),
            ("kv_cache_usage_perc", "fraction of KV cache blocks in use", sch.blocks.usage),
            ("kv_cache_blocks_total", "KV cache blocks", sch.blocks.num_blocks),
        ]
        counters = [
            ("prompt_tokens", "prompt tokens of admitted requests", st.prompt_tokens),
            ("generation_tokens", "generated tokens", st.generation_tokens),
            ("computed_tokens", "tokens run through the model (prefill, recompute, decode)", st.computed_tokens),
            ("request_success", "requests finished (stop or length)", st.requests_finished),
            ("request_aborted", "requests aborted (client gone)", st.requests_aborted),
            ("prefix_cache_queries", "prompt tokens looked up in the prefix cache (every admitted prompt; "
             "caching off: none found)", st.prompt_tokens),
            ("prefix_cache_hits", "prompt tokens found in the prefix cache", st.prefix_cache_hits),
            ("num_preemptions", "sequences preempted for lack of KV blocks", sch.num_preemptions),
            ("engine_steps", "engine steps", st.steps),
            ("engine_step_seconds", "time spent in engine steps", st.step_seconds),
        ]
        for name, help_, value in gauges:
            yield GaugeMetricFamily(PREFIX + name, help_, value=value)
        for name, help_, value in counters:
            yield CounterMetricFamily(PREFIX + name, help_, value=value)
        if self.stalls is not None:
            yield from self._stalls(self.stalls)

    @staticmethod
    def _stalls(stalls):
        """What stopped every stream: collector pauses and Triton compiles (server_process.Stalls)."""
        gcp, jit = stalls.gc, stalls.jit
        pauses = CounterMetricFamily(PREFIX + "gc_pauses", "garbage collector runs (they stop every thread)",
                                     labels=["generation"])
        seconds = CounterMetricFamily(PREFIX + "gc_pause_seconds", "time the garbage collector ran",
                                      labels=["generation"])
        for g in range(3):
            pauses.add_metric([str(g)], gcp.count[g])
            seconds.add_metric([str(g)], gcp.seconds[g])
        yield pauses
        yield seconds
        yield GaugeMetricFamily(PREFIX + "gc_pause_longest_seconds", "the longest garbage collector run since "
                                "the server was ready", value=gcp.longest)
        yield GaugeMetricFamily(PREFIX + "gc_frozen_objects", "objects kept out of garbage collections "
                                "(gc.freeze once warmed up)", value=gc.get_freeze_count())
        yield CounterMetricFamily(PREFIX + "jit_compiles", "Triton kernels compiled after the server was ready "
                                  "(each one in the engine thread, with the GPU idle)", value=jit.count)
        yield CounterMetricFamily(PREFIX + "jit_compile_seconds", "time those compiles took", value=jit.seconds)


class ServerMetrics:
    """The registry one server exposes, and the per-request observations its handler makes."""

    def __init__(self, engine, stalls=None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, stalls))

        def hist(name: str, help_: str) -> Histogram:
            return Histogram(PREFIX + name, help_, buckets=_LATENCY_BUCKETS, registry=self.registry)

        self.ttft = hist("time_to_first_token_seconds", "request arrival to its first generated token")
        self.itl = hist("inter_token_latency_seconds", "time between consecutive tokens of one request")
        self.e2e = hist("e2e_request_latency_seconds", "request arrival to its last token (finished requests)")
        self.queue = hist("request_queue_time_seconds", "request arrival to its first scheduling")
        # the rest of vLLM's per-request phases, observed when a request finishes (before its stream ends)
        self.prefill = hist("request_prefill_time_seconds", "first scheduling to the first token")
        self.decode = hist("request_decode_time_seconds", "first token to the last token")
        self.inference = hist("request_inference_time_seconds", "first scheduling to the last token")

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def request(self, seq: Sequence) -> RequestTimer:
        return RequestTimer(self, seq)


class RequestTimer:
    """Observes one request's latencies as its tokens reach the handler."""

    def __init__(self, metrics: ServerMetrics, seq: Sequence) -> None:
        self.m, self.seq = metrics, seq
        self.first: float | None = None
        self.last: float | None = None

    def token(self) -> None:
        now = time.monotonic()
        if self.last is None:
            self.first = now
            self.m.ttft.observe(now - self.seq.arrival_time)
            if self.seq.first_scheduled_time is not None:
                self.m.queue.observe(max(0.0, self.seq.first_scheduled_time - self.seq.arrival_time))
        else:
            self.m.itl.observe(now - self.last)
        self.last = now

    def finished(self) -> None:
        """The request's end-to-end time, and its phases once it produced a token."""
        self.m.e2e.observe(time.monotonic() - self.seq.arrival_time)
        scheduled = self.seq.first_scheduled_time
        if self.first is None or self.last is None or scheduled is None:
            return
        self.m.prefill.observe(max(0.0, self.first - scheduled))
        self.m.decode.observe(self.last - self.first)
        self.m.inference.observe(max(0.0, self.last - scheduled))
