"""The regression gate end to end on a store: pick runs, load frames, compare."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd

from k2bench.harness.analysis import baseline as bl
from k2bench.harness.analysis.regress import RegressConfig, RegressResult, compare, counted, per_run
from k2bench.harness.eval.gate import counts_of, judge_counts


@dataclass
class GateOutput:
    result: RegressResult
    cand_points: list[tuple[float, float, int]]  # (interactivity, tok/s/GPU, concurrency) per run level
    base_points: list[tuple[float, float, int]]


def _plot_points(points: pd.DataFrame) -> list[tuple[float, float, int]]:
    """The closed-loop levels of a frontier chart (rate levels are judged level by level, not as a frontier)."""
    points = counted(points)
    if "mode" in points.columns:
        points = points[points["mode"].fillna("closed") == "closed"]
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
        _judge_accuracy(store, cand_ids, [], res)
        return GateOutput(res, _plot_points(cand_pts), [])
    base_pts = points[points["run_id"].isin(base_ids)]
    hist_pts = points[points["run_id"].isin(hist_ids)] if hist_ids else None
    cand_req = _requests(store, cand_ids) if use_requests else None
    base_req = _requests(store, base_ids) if use_requests else None
    res = compare(cand_pts, base_pts, hist_pts, cand_req, base_req, config)
    res.baseline_reason = sel.reason
    res.candidate_meta, res.baseline_meta = sel.candidate[-1], sel.baseline[-1]
    _judge_accuracy(store, cand_ids, base_ids, res)
    return GateOutput(res, _plot_points(cand_pts), _plot_points(base_pts))


def _counts(evals: dict[int, list[dict]], run_ids: list[int], key: tuple[str, str]) -> tuple[int, int] | None:
    """(right, n) of one (task, metric) pooled over runs (each run's items are independent trials)."""
    return counts_of([e for rid in run_ids for e in evals.get(rid, []) if (e["task"], e["metric"]) == key])


def _judge_accuracy(store, cand_ids: list[int], base_ids: list[int], res: RegressResult) -> None:
    """Accuracy verdicts per evaluated task: the model's threshold and the two-proportion test on the
    pooled counts (per-item scores, or value x n where a run kept none); a failed one makes the whole
    result a regression."""
    cand = store.evals_by_run(cand_ids)
    base = store.evals_by_run(base_ids)
    model = str(res.candidate_meta.get("model") or "")
    for key in sorted({(e["task"], e["metric"]) for evs in cand.values() for e in evs}):
        c_counts = _counts(cand, cand_ids, key)
        if c_counts is None:
            res.notes.append(f"accuracy {key[0]}: the candidate has no items to count; not gated")
            continue
        verdict = judge_counts(key[0], model, c_counts, _counts(base, base_ids, key))
        res.accuracy.append(asdict(verdict))
        if verdict.failed:
            res.overall = "regression"
