"""The run page's workload section: the definition the run recorded, per-turn figures of conversations,
and per-request prompt lengths and prefix-cache hits (dataset lengths vary; a cache hits some requests)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st


def turn_table(points: list[dict]) -> pd.DataFrame:
    """One row per (level, turn) of a conversation run; empty when no level has turns."""
    rows = []
    for p in points:
        for turn, t in sorted((p.get("turns") or {}).items(), key=lambda kv: int(kv[0])):
            rows.append({"concurrency": p["concurrency"], "trial": p.get("trial", 0), "turn": int(turn),
                         "requests": t.get("requests"), "TTFT p50 ms": t.get("ttft_ms_median"),
                         "TTFT p90 ms": t.get("ttft_ms_p90"), "TTFT p99 ms": t.get("ttft_ms_p99"),
                         "prompt tokens (mean)": t.get("prompt_tokens_mean"), "hit rate": t.get("hit_rate")})
    return pd.DataFrame(rows)


def length_figure(requests: pd.DataFrame) -> go.Figure | None:
    """Histogram of each request's prompt tokens (the server's count, else the length asked for) and, where the
    server reported them, its cached tokens; None without requests."""
    if requests.empty:
        return None
    prompt = requests["prompt_tokens"].fillna(requests["requested_input_tokens"])
    fig = go.Figure(go.Histogram(x=prompt, name="prompt tokens", nbinsx=40, opacity=0.7))
    if requests["cached_tokens"].notna().any():
        fig.add_trace(go.Histogram(x=requests["cached_tokens"].dropna(), name="cached tokens", nbinsx=40,
                                   opacity=0.7))
    fig.update_layout(title="Prompt lengths per request", xaxis_title="tokens", yaxis_title="requests",
                      barmode="overlay")
    return fig


def render(meta: dict, points: list[dict], requests: pd.DataFrame) -> None:
    definition = meta.get("workload_def")
    turns = turn_table(points)
    fig = length_figure(requests)
    if not definition and turns.empty and (fig is None or requests["prompt_tokens"].nunique() <= 1):
        return  # random prompts of one length: the level table says it all
    st.subheader("Workload")
    if definition:
        st.json(definition, expanded=False)
    if not turns.empty:
        st.markdown("**Per turn** (turn k sends the whole conversation so far)")
        st.dataframe(turns, hide_index=True, key="detail_turns")
    if fig is not None:
        st.plotly_chart(fig, key="detail_lengths")
