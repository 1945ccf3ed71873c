"""Run-page chart of one level's one-second slices: output tokens/s, requests in flight and TPOT over the
level, with its steady-state window shaded (k2bench.harness.measure.steady defines both).

A pure function of an exported point (``steady``), so tests build exactly what the page shows.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

ROWS = (("output_tok_s", "output tok/s"), ("in_flight", "in flight"), ("tpot_ms", "TPOT ms"))


def slices_figure(point: dict) -> go.Figure | None:
    """None when the level has no slices (stored before they were, or imported)."""
    steady = point.get("steady") or {}
    sl = steady.get("slices") or {}
    if not sl.get("t_s"):
        return None
    fig = make_subplots(rows=len(ROWS), cols=1, shared_xaxes=True, vertical_spacing=0.04)
    for row, (key, label) in enumerate(ROWS, start=1):
        fig.add_trace(go.Scatter(x=sl["t_s"], y=sl[key], mode="lines+markers", name=label, line_shape="hv"),
                      row=row, col=1)
        fig.update_yaxes(title_text=label, row=row, col=1)
        if steady.get("start_s") is not None:
            fig.add_vrect(x0=steady["start_s"], x1=steady["end_s"], fillcolor="green", opacity=0.08,
                          line_width=0, row=row, col=1)
    threshold = steady.get("threshold")
    if threshold:
        fig.add_hline(y=threshold, line_dash="dot", line_color="grey", row=2, col=1,
                      annotation_text=f"{threshold} = {steady.get('fraction', 0.9):.0%} of the concurrency")
    window = ("steady state (shaded) " f"{steady['start_s']:.1f}-{steady['end_s']:.1f} s"
              if steady.get("start_s") is not None else "no steady state: the in-flight count never reached the threshold")
    fig.update_layout(title=f"Concurrency {point.get('concurrency')}: one-second slices; {window}",
                      showlegend=False, height=520, margin={"t": 60})
    fig.update_xaxes(title_text="s from the first measured send", row=len(ROWS), col=1)
    return fig
