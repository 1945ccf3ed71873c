"""Plotly figures of the dashboard. Pure functions of DataFrames, so the benchmark and the tests
build exactly what the pages show."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from k2bench.dashboard import data


@dataclass(frozen=True)
class View:
    title: str
    x: str
    y: str
    maximize_x: bool
    maximize_y: bool


VIEWS = {
    "Throughput vs interactivity": View("Throughput per GPU vs interactivity",
                                        "interactivity_median", "tput_per_gpu", True, True),
    # throughput against end-to-end latency, as InferenceX plots it: a trade-off, so its frontier is a
    # line (interactivity against latency is not one: the lowest concurrency wins on both)
    "Throughput vs E2E latency": View("Throughput per GPU vs E2E latency",
                                      "e2el_ms_median", "tput_per_gpu", False, True),
    "TTFT vs throughput": View("TTFT vs throughput per GPU", "tput_per_gpu", "ttft_ms_median", True, False),
    # the frontier's y axis as energy or money (levels without GPU telemetry or a price are not drawn)
    "Tokens per joule vs interactivity": View("Tokens per joule vs interactivity", "interactivity_median",
                                              "tokens_per_j", True, True),
    "Cost vs interactivity": View("Cost per million tokens vs interactivity", "interactivity_median",
                                  "usd_per_mtok", True, False),
}
PALETTE = qualitative.Plotly
REGRESSION_COLOR = "#d62728"
IMPROVEMENT_COLOR = "#2ca02c"
INVALID_COLOR = "#9e9e9e"


def _label(col: str) -> str:
    return data.METRICS[col].label if col in data.METRICS else col


def _layout(fig: go.Figure, title: str, x: str, y: str, log: bool = False) -> go.Figure:
    # no template: Streamlit applies its own theme, and building one costs more than the rest
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y,
                      legend={"orientation": "h", "y": -0.2}, margin={"t": 60, "l": 60, "r": 20},
                      hovermode="closest")
    if log:
        fig.update_xaxes(type="log")
        fig.update_yaxes(type="log")
    return fig


def frontier_figure(levels: pd.DataFrame, view: View, by: str = "config",
                    reference: pd.DataFrame | None = None, log: bool = False,
                    title: str | None = None, invalid: pd.DataFrame | None = None) -> go.Figure:
    """Every level as a point labelled with its concurrency; each group's frontier as a line.

    Levels without a value on either axis (no GPU telemetry, no price) are left out, and said so.
    ``invalid``: levels that do not count, drawn grey and unjoined with their reason on hover, so a
    user can see what was measured and why it was left out without it touching any frontier."""
    fig = go.Figure()
    drawn = levels.dropna(subset=[c for c in (view.x, view.y) if c in levels.columns])
    if view.y not in levels.columns or len(drawn) < len(levels):
        left_out = len(levels) - (len(drawn) if view.y in levels.columns else 0)
        fig.add_annotation(text=f"{left_out} level(s) without {_label(view.y)} are not drawn", xref="paper",
                           yref="paper", x=1, y=1.02, showarrow=False, xanchor="right", yanchor="bottom",
                           font={"size": 10})
    levels = drawn if view.y in levels.columns else levels.iloc[0:0]
    front = data.frontier_points(levels, view.x, view.y, view.maximize_x, view.maximize_y, by=by)
    for i, (name, grp) in enumerate(levels.groupby(by, sort=False)):
        color = PALETTE[i % len(PALETTE)]
        hover = _hover(grp)
        fig.add_trace(go.Scatter(
            x=grp[view.x], y=grp[view.y], mode="markers+text", name=str(name), legendgroup=str(name),
            text=_level_text(grp), textposition="top center",
            marker={"color": color, "size": 9}, customdata=hover, hovertemplate="%{customdata}<extra></extra>"))
        line = front[front[by] == name]
        fig.add_trace(go.Scatter(
            x=line[view.x], y=line[view.y], mode="lines", name=f"{name} frontier", legendgroup=str(name),
            line={"color": color, "width": 2}, showlegend=False, hoverinfo="skip"))
    if invalid is not None and not invalid.empty:
        _add_invalid(fig, invalid, view, by)
    if reference is not None and not reference.empty:
        _add_reference(fig, reference, view)
    return _layout(fig, title or view.title, _label(view.x), _label(view.y), log)


def _add_invalid(fig: go.Figure, invalid: pd.DataFrame, view: View, by: str) -> None:
    if view.x not in invalid.columns or view.y not in invalid.columns:
        return
    drawable = invalid.dropna(subset=[view.x, view.y])  # e.g. no finished request, or no GPU telemetry
    if drawable.empty:
        return
    hover = [f"INVALID: {row.get('invalid_reason') or 'no reason stored'}<br>{row.get(by, '')}<br>{text}"
             for row, text in zip(drawable.to_dict("records"), _hover(drawable), strict=True)]
    fig.add_trace(go.Scatter(
        x=drawable[view.x], y=drawable[view.y], mode="markers+text", name="invalid levels (not counted)",
        text=_level_text(drawable), textposition="bottom center",
        textfont={"color": INVALID_COLOR}, marker={"color": INVALID_COLOR, "size": 9, "symbol": "x"},
        customdata=hover, hovertemplate="%{customdata}<extra></extra>"))


def _level_text(grp: pd.DataFrame) -> list[str]:
    """Point labels: c8 for a closed level, r2/s for a rate level (data.with_levels)."""
    if "level" in grp.columns:
        return [str(v) for v in grp["level"]]
    return [f"c{int(c)}" for c in grp["concurrency"]]


def _hover(grp: pd.DataFrame) -> list[str]:
    out = []
    for row in grp.to_dict("records"):
        level = row.get("level")
        bits = [f"concurrency {int(row['concurrency'])}" if not level or str(level).startswith("c")
                else f"rate {str(level)[1:]} (at most {int(row['concurrency'])} in flight)"]
        for col in ("tput_per_gpu", "interactivity_median", "ttft_ms_median", "e2el_ms_median"):
            if col in row and row[col] == row[col]:
                bits.append(f"{_label(col)}: {row[col]:.4g}")
        if "commit" in row and row.get("commit"):
            bits.append(f"commit {str(row['commit'])[:10]} ({row.get('branch') or '-'})")
        if "run_id" in row:
            bits.append(f"run #{row['run_id']}")
        if "runs" in row:
            bits.append(f"median of {int(row['runs'])} run(s)")
        out.append("<br>".join(bits))
    return out


def _add_reference(fig: go.Figure, ref: pd.DataFrame, view: View) -> None:
    """Published points where the source states both coordinates; a guide line where it states one."""
    for name, grp in ref.groupby("name", sort=False):
        source = grp["source"].iloc[0]
        full = grp.dropna(subset=[c for c in (view.x, view.y) if c in grp.columns])
        if view.x in grp.columns and view.y in grp.columns and not full.empty:
            fig.add_trace(go.Scatter(
                x=full[view.x], y=full[view.y], mode="markers+text", name=f"{name}",
                text=[f"c{int(c)} (ref)" for c in full["concurrency"]], textposition="bottom center",
                marker={"symbol": "star", "size": 14, "color": "black"},
                hovertemplate=f"{name}<br>%{{text}}<br>x=%{{x}}, y=%{{y}}<br>source: {source}<extra></extra>"))
        # a point that gives only the x coordinate (e.g. interactivity without throughput)
        if view.x in grp.columns:
            partial = grp[grp[view.x].notna() & (grp[view.y].isna() if view.y in grp.columns else True)]
            for row in partial.to_dict("records"):
                fig.add_vline(x=row[view.x], line_dash="dot", line_color="black",
                              annotation_text=f"ref c{int(row['concurrency'])}: {row[view.x]:g}",
                              annotation_position="bottom right")
        fig.add_annotation(text=f"Reference: {name}. Source: {source}", xref="paper", yref="paper",
                           x=0, y=1.02, showarrow=False, xanchor="left", yanchor="bottom",
                           font={"size": 10})


# History's y-axis choices. An axis fitted to the data makes run-to-run noise of a few percent fill
# the plot and look like a cliff, so the default starts at zero; "% of median" reads as noise directly.
Y_FROM_ZERO, Y_PERCENT, Y_FITTED = "from zero", "% of median", "fitted to the data"
Y_AXES = (Y_FROM_ZERO, Y_PERCENT, Y_FITTED)


def history_figure(series: pd.DataFrame, metric: str, marks: pd.DataFrame, by_commit: bool = False,
                   title: str | None = None, y_axis: str = Y_FROM_ZERO,
                   culprits: pd.DataFrame | None = None) -> go.Figure:
    """A metric over runs (time or commit order) with change points drawn as coloured markers and
    bisected culprits as crosses on the first run after them.

    ``y_axis``: one of Y_AXES. With Y_PERCENT every value is drawn as a percentage of the series'
    median (hover text keeps the measured values)."""
    if y_axis not in Y_AXES:
        raise ValueError(f"y_axis must be one of {', '.join(Y_AXES)}, not {y_axis!r}")
    fig = go.Figure()
    xcol = "position" if by_commit else "started_at"
    s = series.copy()
    s["position"] = np.arange(len(s))
    ycol, ylabel = metric, _label(metric)
    if y_axis == Y_PERCENT:
        ycol, ylabel = "_percent", f"{_label(metric)}, % of median"
        s[ycol] = s[metric] / s[metric].median() * 100.0
    hover = [f"{_label(metric)}: {v:.4g}<br>commit {str(c)[:10]}<br>branch {b}<br>{pd.Timestamp(t):%Y-%m-%d %H:%M} UTC"
             f"<br>run #{r}" for v, c, b, t, r in zip(s[metric], s["commit"], s["branch"], s["started_at"],
                                                     s["run_id"], strict=True)]
    fig.add_trace(go.Scatter(x=s[xcol], y=s[ycol], mode="lines+markers", name=_label(metric),
                             customdata=hover, hovertemplate="%{customdata}<extra></extra>"))
    for kind, color, symbol in (("regression", REGRESSION_COLOR, "triangle-down"),
                                ("improvement", IMPROVEMENT_COLOR, "triangle-up")):
        m = marks[marks["kind"] == kind] if not marks.empty else marks
        hit = s.merge(m[["run_id", "rel_change"]], on="run_id") if not m.empty else s.iloc[0:0]
        if hit.empty:
            continue
        fig.add_trace(go.Scatter(
            x=hit[xcol], y=hit[ycol], mode="markers", name=f"change point ({kind})",
            marker={"color": color, "size": 16, "symbol": symbol, "line": {"width": 1, "color": "black"}},
            customdata=[f"{kind}: {rc * 100:+.1f}% at commit {str(c)[:10]}"
                        for rc, c in zip(hit["rel_change"], hit["commit"], strict=True)],
            hovertemplate="%{customdata}<extra></extra>"))
        for x in hit[xcol]:
            fig.add_vline(x=x, line_dash="dash", line_color=color, opacity=0.5)
    if culprits is not None and not culprits.empty:
        hit = s.merge(culprits, on="run_id")
        fig.add_trace(go.Scatter(
            x=hit[xcol], y=hit[ycol], mode="markers", name="culprit (bisected)",
            marker={"color": REGRESSION_COLOR, "size": 20, "symbol": "x-thin-open", "line": {"width": 3}},
            customdata=[f"culprit {str(c)[:10]}: {subj or ''}<br>first bad between {str(g)[:10]} and {str(b)[:10]}"
                        for c, subj, g, b in zip(hit["first_bad"], hit["subject"], hit["good"], hit["bad"],
                                                 strict=True)],
            hovertemplate="%{customdata}<extra></extra>"))
    if by_commit:
        fig.update_xaxes(tickmode="array", tickvals=s["position"], ticktext=[str(c)[:7] for c in s["commit"]])
    if y_axis == Y_FROM_ZERO:
        fig.update_yaxes(rangemode="tozero")
    elif y_axis == Y_PERCENT:
        fig.add_hline(y=100.0, line_dash="dot", line_color="gray")
    return _layout(fig, title or f"{_label(metric)} history", "commit" if by_commit else "run start (UTC)",
                   ylabel)


def ttft_histogram(requests: pd.DataFrame) -> go.Figure:
    ok = requests[requests["success"].astype(bool)]
    fig = go.Figure(go.Histogram(x=ok["ttft_ms"], nbinsx=40, name="TTFT"))
    return _layout(fig, "TTFT distribution", "TTFT (ms)", "requests")


def itl_cdf(itl_ms: np.ndarray) -> go.Figure:
    xs = np.sort(np.asarray(itl_ms, dtype=float))
    n = len(xs)
    idx = np.arange(n)
    if n > 5000:  # the curve's shape needs no more than a few thousand steps
        idx = np.linspace(0, n - 1, 5000).astype(int)
    # the empirical CDF: the (i+1)-th smallest gap has (i+1)/n of the gaps at or below it
    fig = go.Figure(go.Scatter(x=xs[idx], y=(idx + 1) / max(n, 1), mode="lines", name="ITL CDF",
                               line_shape="hv"))
    return _layout(fig, "Inter-token latency CDF", "ITL (ms)", "fraction of gaps ≤ x")


def request_timeline(requests: pd.DataFrame) -> go.Figure:
    """Each request as a bar from send to finish (first token marked), one row per request."""
    r = requests.sort_values("send_s").reset_index(drop=True)
    fig = go.Figure()
    for ok, name, color in ((True, "succeeded", PALETTE[0]), (False, "failed", REGRESSION_COLOR)):
        part = r[r["success"].astype(bool) == ok]
        if part.empty:
            continue
        xs, ys = [], []
        for row, s, e in zip(part.index, part["send_s"], part["end_s"], strict=True):
            xs += [s, e if e == e else s, None]
            ys += [row, row, None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"request ({name})",
                                 line={"color": color, "width": 2}, hoverinfo="skip"))
    ok = r[r["success"].astype(bool) & r["ttft_ms"].notna()]
    fig.add_trace(go.Scatter(x=ok["send_s"] + ok["ttft_ms"] / 1000.0, y=ok.index, mode="markers",
                             name="first token", marker={"size": 4, "color": "black"},
                             hovertemplate="first token at %{x:.3f}s<extra></extra>"))
    return _layout(fig, "Request timeline", "time since level start (s)", "request (by send time)")
