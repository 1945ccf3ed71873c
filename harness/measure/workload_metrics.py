"""What a workload's content does to a level: the prefix-cache hit rate and, for conversations, the
figures of each turn.

Hit rate = prompt tokens found in the server's prefix cache / prompt tokens looked up, over the measured
window. The server's own counters are preferred where it has them (their window deltas, from
k2bench.harness.telemetry.server_metrics): the bundled engine's ``k2bench_prefix_cache_{hits,queries}``,
vLLM's ``vllm:prefix_cache_{hits,queries}`` (summed over their labels); SGLang exposes a gauge,
``sglang:cache_hit_rate``, whose window mean is used. Otherwise the rate is computed from the responses:
sum of ``usage.prompt_tokens_details.cached_tokens`` / sum of ``usage.prompt_tokens`` of the measured
requests that reported both. None when neither is there (the server says nothing about a cache).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from k2bench.harness.load.records import RequestRecord

# (source recorded, hits counter, queries counter)
COUNTER_PAIRS = (("k2bench_prefix_cache", "k2bench_prefix_cache_hits_total", "k2bench_prefix_cache_queries_total"),
                 ("vllm:prefix_cache", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"))
HIT_RATE_GAUGES = ("sglang:cache_hit_rate",)
USAGE_SOURCE = "usage.cached_tokens"


def _summed(counters: dict, name: str) -> float | None:
    values = [v for k, v in counters.items() if k == name or k.startswith(name + "{")]
    return float(sum(values)) if values else None


def hit_rate_from_server(server_metrics: dict | None) -> tuple[float | None, str | None]:
    """(rate, source) from the server's window counters or gauge; (None, None) when it has neither."""
    if not server_metrics:
        return None, None
    counters = server_metrics.get("counters") or {}
    for source, hits_name, queries_name in COUNTER_PAIRS:
        hits, queries = _summed(counters, hits_name), _summed(counters, queries_name)
        if hits is not None and queries:
            return min(max(hits / queries, 0.0), 1.0), source
    gauges = server_metrics.get("gauges") or {}
    for name in HIT_RATE_GAUGES:
        g = next((v for k, v in gauges.items() if k == name or k.startswith(name + "{")), None)
        if isinstance(g, dict) and g.get("mean") is not None:
            return min(max(float(g["mean"]), 0.0), 1.0), name
    return None, None


def hit_rate_from_usage(records: Sequence[RequestRecord]) -> float | None:
    both = [r for r in records if r.success and r.cached_tokens is not None and r.prompt_tokens]
    if not both:
        return None
    return sum(r.cached_tokens for r in both) / sum(r.prompt_tokens for r in both)


def per_turn(records: Sequence[RequestRecord]) -> dict | None:
    """Conversations: per turn ("1", "2", ...) the requests, TTFT median/p90/p99 in ms, mean prompt tokens and
    the usage hit rate of the measured successful requests; None for a workload without turns."""
    done = [r for r in records if r.success and r.turn is not None and r.token_ns]
    if not done:
        return None
    out = {}
    for turn in sorted({r.turn for r in done}):
        rs = [r for r in done if r.turn == turn]
        ttft = np.asarray([(r.token_ns[0] - r.send_ns) / 1e6 for r in rs], dtype=np.float64)
        p50, p90, p99 = np.percentile(ttft, [50, 90, 99])
        prompts = [r.prompt_tokens for r in rs if r.prompt_tokens is not None]
        out[str(turn)] = {"requests": len(rs), "ttft_ms_median": float(p50), "ttft_ms_p90": float(p90),
                          "ttft_ms_p99": float(p99),
                          "prompt_tokens_mean": float(np.mean(prompts)) if prompts else None,
                          "hit_rate": hit_rate_from_usage(rs)}
    return out


def level_fields(records: Sequence[RequestRecord]) -> dict:
    """The fields summarize_level adds: usage-based hit rate (the sweep prefers the server's counters, see
    ``prefer_server``) and per-turn figures."""
    rate = hit_rate_from_usage(records)
    return {"prefix_hit_rate": rate, "prefix_hit_source": USAGE_SOURCE if rate is not None else None,
            "turns": per_turn(records)}


def prefer_server(point: dict) -> None:
    """Replace the usage-based hit rate with the server's own figure where its /metrics has one."""
    rate, source = hit_rate_from_server(point.get("server_metrics"))
    if rate is not None:
        point["prefix_hit_rate"], point["prefix_hit_source"] = rate, source
