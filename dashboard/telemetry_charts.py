"""Run-page timelines of what the hardware and the server did: per-GPU power and SM clock, and the
server's KV-cache usage and queue, level after level on one time axis.

Pure functions of a run's exported points (``energy.raw``, ``server_metrics.raw``), so the tests
build exactly what the page shows. Levels are laid end to end (each starts where the previous
one's window ended) and their boundaries are labelled with the concurrency.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.colors import qualitative

PALETTE = qualitative.Plotly
# gauges worth a line, as the bundled engine and vLLM name them; any other gauge is left out
KV_GAUGES = ("k2bench_kv_cache_usage_perc", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
             "sglang:token_usage")
QUEUE_GAUGES = ("k2bench_num_requests_running", "k2bench_num_requests_waiting", "vllm:num_requests_running",
                "vllm:num_requests_waiting", "sglang:num_running_reqs", "sglang:num_queue_reqs")


def _levels(points: list[dict], key: str) -> list[tuple[str, float, dict]]:
    """(label, time offset, raw) of each level that has raw samples under `key`, end to end."""
    out, offset = [], 0.0
    for p in sorted(points, key=lambda p: (p.get("concurrency", 0), p.get("trial") or 0)):
        raw = ((p.get(key) or {}).get("raw")) or None
        if not raw or not raw.get("t_s"):
            continue
        label = f"c{p.get('concurrency')}" + (f" t{p['trial']}" if p.get("trial") else "")
        out.append((label, offset, raw))
        offset += raw["t_s"][-1] + 1.0  # a second's gap keeps levels apart on the axis
    return out


def _mark(fig: go.Figure, levels: list[tuple[str, float, dict]]) -> None:
    for label, offset, _ in levels:
        fig.add_vline(x=offset, line_dash="dot", line_color="grey", annotation_text=label,
                      annotation_position="top left")


def _layout(fig: go.Figure, title: str, y: str) -> go.Figure:
    fig.update_layout(title=title, xaxis_title="seconds (measured windows, level after level)", yaxis_title=y,
                      legend={"orientation": "h", "y": -0.25}, margin={"t": 60, "l": 60, "r": 20})
    return fig


def gpu_timeline(points: list[dict], field: str = "power_w", title: str | None = None) -> go.Figure | None:
    """One line per GPU of `field` (power_w, sm_clock_mhz, mem_clock_mhz, temp_c, ...); None without samples."""
    levels = _levels(points, "energy")
    if not levels:
        return None
    fig = go.Figure()
    gpus: dict[str, tuple[list, list]] = {}
    for _, offset, raw in levels:
        for g in raw["gpus"]:
            xs, ys = gpus.setdefault(str(g["id"]), ([], []))
            xs += [offset + t for t in raw["t_s"]] + [None]
            ys += list(g.get(field) or [None] * len(raw["t_s"])) + [None]
    for i, (gid, (xs, ys)) in enumerate(gpus.items()):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"GPU {gid}", line={"color": PALETTE[i % len(PALETTE)]},
                                 connectgaps=False))
    _mark(fig, levels)
    names = {"power_w": ("GPU power", "W"), "sm_clock_mhz": ("SM clock", "MHz"),
             "mem_clock_mhz": ("memory clock", "MHz"), "temp_c": ("temperature", "°C"),
             "util_pct": ("utilisation", "%"), "mem_used_mib": ("memory used", "MiB")}
    name, unit = names.get(field, (field, ""))
    return _layout(fig, title or f"{name[0].upper()}{name[1:]} per GPU", f"{name} ({unit})" if unit else name)


def server_timeline(points: list[dict], which: str = "kv") -> go.Figure | None:
    """The server's KV-cache usage ('kv') or running/waiting requests ('queue'); None without samples."""
    wanted = KV_GAUGES if which == "kv" else QUEUE_GAUGES
    levels = _levels(points, "server_metrics")
    series: dict[str, tuple[list, list]] = {}
    for _, offset, raw in levels:
        for name in wanted:
            values = raw.get("gauges", {}).get(name)
            if values is None:
                continue
            xs, ys = series.setdefault(name, ([], []))
            xs += [offset + t for t in raw["t_s"]] + [None]
            ys += list(values) + [None]
    if not series:
        return None
    fig = go.Figure()
    for i, (name, (xs, ys)) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, marker={"size": 4},
                                 line={"color": PALETTE[i % len(PALETTE)], "shape": "hv"}))
    _mark(fig, levels)
    if which == "kv":
        return _layout(fig, "Server KV-cache usage", "fraction of KV cache in use")
    return _layout(fig, "Server queue", "requests")


def roofline_figure(points: list[dict], roof: dict) -> go.Figure:
    """The run's levels (tok/s/GPU against tok/s/user) beside its roofline curve, each level labelled
    with its share of the limit at its concurrency."""
    fig = go.Figure()
    curve = sorted(roof["points"], key=lambda p: p["interactivity"])
    fig.add_trace(go.Scatter(x=[p["interactivity"] for p in curve], y=[p["tput_per_gpu"] for p in curve],
                             mode="lines+markers", name=f"roofline ({roof['hardware']}, {roof.get('dtype', '')})",
                             text=[f"c{p['concurrency']}" for p in curve], marker={"size": 5, "color": "black"},
                             line={"dash": "dash", "color": "black"},
                             hovertemplate="%{text}: %{y:.4g} tok/s/GPU at %{x:.4g} tok/s/user<extra>limit</extra>"))
    measured = [p for p in points if p.get("tput_per_gpu") and (p.get("interactivity") or {}).get("median")]
    fig.add_trace(go.Scatter(
        x=[p["interactivity"]["median"] for p in measured], y=[p["tput_per_gpu"] for p in measured],
        mode="markers+text", name="measured", marker={"size": 9, "color": PALETTE[0]},
        text=[f"c{p['concurrency']}" + (f" ({p['pct_roofline']:.0f}%)" if p.get("pct_roofline") is not None else "")
              for p in measured], textposition="top center"))
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    fig.add_annotation(text=f"limit from {roof['source']}", xref="paper", yref="paper", x=0, y=1.02,
                       showarrow=False, xanchor="left", yanchor="bottom", font={"size": 10})
    return _layout(fig, "Measured levels against the roofline", "tok/s/GPU").update_xaxes(
        title="Interactivity (tok/s/user)")
