"""The regression gate end to end on a store: pick runs, load frames, compare."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from k2bench.harness.analysis import baseline as bl
from k2bench.harness.analysis.regress import RegressConfig, RegressResult, compare, counted, per_run


@dataclass
class GateOutput:
    result: RegressResult
    cand_points: list[tuple[float, float, int]]  # (interactivity, tok/s/GPU, concurrency) per run level
    base_points: list[tuple[float, float, int]]


def _plot_points(points: pd.DataFrame) -> list[tuple[float, float, int]]:
    points = counted(points)
    if len(points) == 0:
        return []
    pr = per_run(points)
    return [(float(r.interactivity_median), float(r.tput_per_gpu), int(r.concurrency))
            for r in pr.itertuples() if pd.notna(r.interactivity_median) and pd.notna(r.tput_per_gpu)]


def _requests(store, run_ids: list[int]) -> pd.DataFrame | None:
    frames = []
    for rid in run_ids:
        df = store.requests_frame(rid)
        if df is not None and len(df):
            frames.append(df.assign(run_id=rid))
    return pd.concat(frames, ignore_index=True) if frames else None


def run_gate(store, candidate: str, baseline: str = "auto", opts: bl.BaselineOptions | None = None,
             config: RegressConfig | None = None, use_requests: bool = True) -> GateOutput:
    opts = opts or bl.BaselineOptions()
    cand_runs = bl.resolve_runs(store, candidate, opts.repo)
    sel = bl.select(store, cand_runs, baseline, opts)
    cand_ids = [r["id"] for r in sel.candidate]
    base_ids = [r["id"] for r in sel.baseline]
    hist_ids = [r["id"] for r in sel.history]
    # one query for every run involved: the history holds the baseline runs, so separate queries
    # would read those twice
    points = store.points_frame(run_ids=sorted({*cand_ids, *base_ids, *hist_ids}))
    cand_pts = points[points["run_id"].isin(cand_ids)]
    if not sel.baseline:
        res = RegressResult(candidate_runs=cand_ids, baseline_runs=[], history_runs=[], verdicts=[],
                            frontier=None, overall="no-baseline", baseline_reason=sel.reason,
                            candidate_meta=sel.candidate[-1])
        return GateOutput(res, _plot_points(cand_pts), [])
    base_pts = points[points["run_id"].isin(base_ids)]
    hist_pts = points[points["run_id"].isin(hist_ids)] if hist_ids else None
    cand_req = _requests(store, cand_ids) if use_requests else None
    base_req = _requests(store, base_ids) if use_requests else None
    res = compare(cand_pts, base_pts, hist_pts, cand_req, base_req, config)
    res.baseline_reason = sel.reason
    res.candidate_meta, res.baseline_meta = sel.candidate[-1], sel.baseline[-1]
    return GateOutput(res, _plot_points(cand_pts), _plot_points(base_pts))
