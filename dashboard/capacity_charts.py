"""The Capacity view's data and figure: each capacity search's result (run extra.capacity) over commits.

Pure functions of the store's run dicts and DataFrames, so the page and its tests build the same thing.
A search's answer is a bracket: the highest load that met the target (the capacity, drawn as the point)
and the lowest that missed (drawn as the top of its bar); goodput at capacity is the second panel.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from k2bench.dashboard import data

COLUMNS = ["run_id", "commit", "branch", "started_at", "fingerprint", "config", "search", "capacity", "missed_at",
           "goodput_per_gpu", "status", "attainment", "attainment_low", "probes"]
UNIT = {"concurrency": "requests in flight", "rate": "requests/s"}


def capacity_table(runs: list[dict]) -> pd.DataFrame:
    """One row per run that holds a capacity search result, oldest first."""
    rows = []
    for r in runs:
        cap = (r.get("extra") or {}).get("capacity")
        if not isinstance(cap, dict) or not cap.get("probes"):
            continue
        below, above = cap.get("below") or {}, cap.get("above") or {}
        rows.append({
            "run_id": r["id"], "commit": r.get("commit"), "branch": r.get("branch"), "started_at": r.get("started_at"),
            "fingerprint": r.get("fingerprint"), "engine": r.get("engine"), "engine_version": r.get("engine_version"),
            "model": r.get("model"), "precision": r.get("precision"), "hardware": r.get("hardware"),
            "num_gpus": r.get("num_gpus"), "tp": r.get("tp"), "workload": r.get("workload"),
            "search": f"by {cap['by']} at {cap['slo']}, target {100 * cap['target']:g}%",
            "capacity": cap.get("capacity"), "missed_at": above.get("load"),
            "goodput_per_gpu": cap.get("goodput_per_gpu"), "status": cap.get("status"),
            "attainment": below.get("attainment"), "attainment_low": below.get("low"), "probes": len(cap["probes"]),
        })
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    df = pd.DataFrame(rows)
    df["started_at"] = pd.to_datetime(df["started_at"], utc=True, format="ISO8601")
    df["config"] = data.config_labels(df)
    return df.sort_values(["started_at", "run_id"], kind="stable")[COLUMNS].reset_index(drop=True)


def capacity_figure(series: pd.DataFrame, by: str = "concurrency") -> go.Figure:
    """Capacity (with the bracket up to the first missing load) and goodput at capacity, per run."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=(f"capacity ({UNIT.get(by, by)})", "goodput at capacity (tok/s/GPU)"))
    x = [f"{str(c or '')[:10]} #{r}" for c, r in zip(series["commit"], series["run_id"], strict=True)]
    cap = series["capacity"].astype(float)
    bar = (series["missed_at"].astype(float) - cap).where(series["missed_at"].notna())
    hover = [f"run #{r}, commit {str(c or '')[:10]}<br>capacity {v:g} ({s})<br>first miss at {m}"
             for r, c, v, s, m in zip(series["run_id"], series["commit"], cap, series["status"],
                                      series["missed_at"].fillna("none"), strict=True)]
    fig.add_trace(go.Scatter(x=x, y=cap, mode="lines+markers", name="capacity",
                             error_y={"type": "data", "symmetric": False, "array": bar.fillna(0).tolist(),
                                      "arrayminus": [0] * len(cap)},
                             customdata=hover, hovertemplate="%{customdata}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=series["goodput_per_gpu"].astype(float), mode="lines+markers",
                             name="goodput tok/s/GPU"), row=2, col=1)
    fig.update_layout(height=560, showlegend=False)
    fig.update_yaxes(rangemode="tozero")
    return fig
