"""Where a request's time went at the server, and how well its speculation guessed, from one level's
server metrics (k2bench.harness.telemetry.server_metrics.summarize, stored as the level's ``server_metrics``).

Time split: each phase is read from the histogram the server keeps of it, over the measured window
(bucket deltas, k2bench.harness.telemetry.histograms): mean = the window's sum / its count (exact), p50 and p99 by
interpolation within the bucket the rank falls in (off by at most that bucket's width; the bucket
is kept in ``split`` beside each value). Phases as vLLM defines them, from the moments a request
was queued, first scheduled, produced its first token and its last:

- queue     = first scheduled - queued
- prefill   = first token - first scheduled
- decode    = last token - first token
- inference = last token - first scheduled  (prefill + decode)

and server TTFT = queue + prefill (means). Several series of one family (labels: engine, model) are
pooled. Several servers (``--metrics-url`` given more than once: the workers of a disaggregated
server, each passed once by every request) carry an ``instance`` label; a phase's figures are then
the sums of each instance's figures: exact for the mean, and for a percentile exact only when one
instance alone spends time in that phase (otherwise an estimate).

Speculative decoding, from vLLM's counters over the window: acceptance length = 1 + accepted
tokens / drafts (the tokens one verification step yields: the accepted draft tokens plus the one
the target model adds), draft acceptance rate = accepted tokens / draft tokens. SGLang exposes
both only as gauges of its recent steps (``sglang:spec_accept_length``, ``sglang:spec_accept_rate``):
their mean over the window's scrapes is taken.
"""

from __future__ import annotations

import re

from k2bench.harness.telemetry.histograms import Delta, pool, quantile

PHASES = ("queue", "prefill", "decode", "inference")
# the histogram of each phase, by server: vLLM, the bundled engine (k2bench_), SGLang (queue only)
FAMILIES: dict[str, tuple[str, ...]] = {
    "queue": ("vllm:request_queue_time_seconds", "k2bench_request_queue_time_seconds", "sglang:queue_time_seconds"),
    "prefill": ("vllm:request_prefill_time_seconds", "k2bench_request_prefill_time_seconds"),
    "decode": ("vllm:request_decode_time_seconds", "k2bench_request_decode_time_seconds"),
    "inference": ("vllm:request_inference_time_seconds", "k2bench_request_inference_time_seconds"),
}
STATS = ("mean", "median", "p99")  # the stored statistics of each phase (p50 is stored as median)
QUANTILES = {"median": 0.5, "p99": 0.99}
VLLM_SPEC = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
             "vllm:spec_decode_num_accepted_tokens_total")
SGLANG_SPEC = ("sglang:spec_accept_length", "sglang:spec_accept_rate")
_INSTANCE = re.compile(r'[{,]instance="([^"]*)"')


def _name(key: str) -> str:
    return key.split("{", 1)[0]


def _instance(key: str) -> str | None:
    m = _INSTANCE.search(key)
    return m.group(1) if m else None


def phase_split(server_metrics: dict | None) -> dict | None:
    """{phase: {mean_ms, median_ms, p99_ms, count, median_bucket_ms, p99_bucket_ms, family}} for each
    phase the server has a histogram of (with observations in the window); None when it has none."""
    hists = (server_metrics or {}).get("histograms") or {}
    out: dict = {}
    for phase in PHASES:
        family = next((f for f in FAMILIES[phase] if any(_name(k) == f for k in hists)), None)
        if family is None:
            continue
        by_instance: dict[str | None, list[Delta]] = {}
        for key, doc in hists.items():
            if _name(key) == family:
                by_instance.setdefault(_instance(key), []).append(Delta.from_json(doc))
        pooled = [pool(ds) for _, ds in sorted(by_instance.items(), key=lambda kv: kv[0] or "")]
        if any(d is None for d in pooled):
            out.setdefault("notes", []).append(f"{family}: series of one server with different buckets")
            continue
        parts = [_figures(d) for d in pooled if d.count > 0]  # a server that saw none of the requests adds nothing
        if parts:
            out[phase] = _add(parts) | {"family": family}
    return out or None


def _figures(d: Delta) -> dict:
    fig: dict = {"count": int(d.count), "mean_ms": d.sum / d.count * 1e3}
    for stat, q in QUANTILES.items():
        value, low, high = quantile(d, q)
        fig[f"{stat}_ms"] = value * 1e3
        fig[f"{stat}_bucket_ms"] = [low * 1e3, None if high == float("inf") else high * 1e3]
    return fig


def _add(parts: list[dict]) -> dict:
    if len(parts) == 1:
        return parts[0]
    out: dict = {"count": min(p["count"] for p in parts), "mean_ms": sum(p["mean_ms"] for p in parts)}
    for stat in QUANTILES:
        out[f"{stat}_ms"] = sum(p[f"{stat}_ms"] for p in parts)
        lows = [p[f"{stat}_bucket_ms"][0] for p in parts]
        highs = [p[f"{stat}_bucket_ms"][1] for p in parts]
        out[f"{stat}_bucket_ms"] = [sum(lows), None if None in highs else sum(highs)]
    return out


def speculation(server_metrics: dict | None) -> dict | None:
    """{accept_len, accept_rate, drafts, draft_tokens, accepted_tokens, source} over the window; None
    when the server reported no speculation in it."""
    sm = server_metrics or {}
    counters, gauges = sm.get("counters") or {}, sm.get("gauges") or {}
    totals = [sum(v for k, v in counters.items() if _name(k) == name) for name in VLLM_SPEC]
    drafts, draft_tokens, accepted = totals
    if drafts > 0:
        return {"accept_len": 1.0 + accepted / drafts,
                "accept_rate": accepted / draft_tokens if draft_tokens > 0 else None,
                "drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted, "source": "vllm counters"}
    means = [[g["mean"] for k, g in gauges.items() if _name(k) == name and g.get("mean") is not None]
             for name in SGLANG_SPEC]
    length, rate = (sum(m) / len(m) if m else None for m in means)
    if length:  # SGLang reports 0 (or nothing) when it does not speculate
        return {"accept_len": length, "accept_rate": rate, "source": "sglang gauges (window mean)"}
    return None


def level_figures(server_metrics: dict | None) -> dict:
    """The flat per-level fields the catalogue follows (None where the server did not say)."""
    split = phase_split(server_metrics) or {}
    out: dict = {}
    for phase in PHASES:
        fig = split.get(phase)
        out[f"server_{phase}_ms"] = None if fig is None else {s: round(fig[f"{s}_ms"], 4) for s in STATS}
    queue, prefill = split.get("queue"), split.get("prefill")
    out["server_ttft_ms"] = (round(queue["mean_ms"] + prefill["mean_ms"], 4)
                             if queue is not None and prefill is not None else None)
    spec = speculation(server_metrics)
    out["spec_accept_len"] = None if spec is None else round(spec["accept_len"], 6)
    rate = None if spec is None else spec["accept_rate"]
    out["spec_accept_rate"] = None if rate is None else round(min(max(rate, 0.0), 1.0), 6)
    return out
