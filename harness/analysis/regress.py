"""Verdicts: is the candidate worse than its baseline, per metric and concurrency, and as a frontier?

Works on pandas frames shaped like ``Store.points_frame`` (one row per run, concurrency and trial)
and, optionally, ``Store.requests_frame`` (one row per measured request). Choosing which runs are the
baseline is k2bench.harness.analysis.baseline's job; this module only compares.

A change is flagged only when it is both

1. larger than a threshold (default 5%, overridable per metric), direction-aware: throughput and
   interactivity are better higher, latencies better lower; and
2. significant (one-sided p below ``alpha``) in every test that applies:
   * the noise test against the spread of the baseline history (a Student-t prediction test on
     runs screened for outliers by median/MAD), when that history holds at least ``min_history`` runs;
   * a Mann-Whitney U test on repeated trials (``sweep --trials K``) when both sides have enough of
     them to reach ``alpha``, otherwise on per-request samples when request frames are given.

When no test applies (one baseline run, one trial, no requests) a large change is reported as
"unconfirmed" and does not fail the gate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from k2bench.harness.analysis import gate_metrics, pareto, stats
from k2bench.harness.measure.catalogue import BY_COLUMN, GATE_METRICS, Metric, over_trials
from k2bench.harness.record.schema import level_label

# The metrics the gate judges by default, with their direction and per-request sample: see the catalogue.
# ``RegressConfig.metrics`` chooses others (k2bench.harness.analysis.gate_metrics).
METRICS: tuple[Metric, ...] = GATE_METRICS
METRIC_BY_COLUMN = {m.column: m for m in METRICS}
# the frontier is tok/s/GPU against tok/s/user: judged when both are
FRONTIER_METRICS = ("tput_per_gpu", "interactivity_median")


@dataclass
class RegressConfig:
    """Every knob of the gate, in one place (the CLI reads and fills this)."""

    threshold: float = 0.05  # relative change that matters
    thresholds: dict[str, float] = field(default_factory=dict)  # per metric column, e.g. {"ttft_ms_p99": 0.1}
    alpha: float = 0.01  # one-sided p-value a change must beat in every applicable test
    min_history: int = 3  # runs of baseline history needed for the noise test
    min_request_samples: int = 5
    frontier_threshold: float | None = None  # default: the tok/s/GPU threshold
    metrics: tuple[str, ...] = gate_metrics.DEFAULT  # the metrics judged (catalogue columns)
    named: tuple[str, ...] = ()  # those the user chose (--gate-metric): reported when they have no data

    def threshold_for(self, column: str) -> float:
        return self.thresholds.get(column, self.threshold)

    def judged(self) -> tuple[Metric, ...]:
        return gate_metrics.metrics_of(self.metrics)

    @property
    def judges_frontier(self) -> bool:
        return all(c in self.metrics for c in FRONTIER_METRICS)

    def validate(self) -> None:
        unknown = [c for c in (*self.metrics, *self.named) if c not in BY_COLUMN]
        if unknown:
            raise ValueError(f"unknown metric(s) to judge: {', '.join(unknown)}; valid: {gate_metrics.valid_names()}")
        if not self.metrics:
            raise ValueError("no metric to judge")
        judged = [*self.metrics, "frontier", "capacity"]
        unknown = sorted(set(self.thresholds) - set(BY_COLUMN) - {"frontier", "capacity"})
        if unknown:
            raise ValueError(f"unknown metric(s) in thresholds: {', '.join(unknown)}; judged: {', '.join(judged)}")
        stray = sorted(set(self.thresholds) - set(judged))
        if stray:
            raise ValueError(f"threshold for metric(s) the gate does not judge: {', '.join(stray)} (add one with "
                             f"--gate-metric +{stray[0]}); judged: {', '.join(judged)}")
        for name, value in [("threshold", self.threshold), *self.thresholds.items()]:
            if not 0 < value < 1:
                raise ValueError(f"threshold {name}={value} must be a fraction between 0 and 1 (0.05 = 5%)")
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"alpha={self.alpha} must be between 0 and 0.5")


@dataclass
class Verdict:
    metric: str
    label: str
    concurrency: int
    higher_is_better: bool
    baseline: float
    candidate: float
    rel_change: float
    worse_by: float
    threshold: float
    factor: float = math.nan  # asv-style: > 1 means worse by that factor (1.10 = 10% worse)
    noise_p: float | None = None
    noise_z: float | None = None
    mw_p: float | None = None
    mw_source: str | None = None  # "trials" or "requests"
    significant: bool | None = None  # None: no test applied
    status: str = "unchanged"  # regression | improvement | noise | unconfirmed | unchanged | missing | invalid
    mode: str = "closed"  # the level's kind (schema.Point.mode): closed, or rate at ``rate`` req/s
    rate: float | None = None

    @property
    def level(self) -> str:
        """The level as tables name it: c8, r2/s (schema.level_label)."""
        return level_label(self.mode, self.rate, self.concurrency)


@dataclass
class FrontierVerdict:
    comparison: pareto.FrontierComparison
    threshold: float
    factor: float = math.nan  # asv-style: > 1 means worse by that factor (1.10 = 10% worse)
    noise_p: float | None = None
    significant: bool | None = None
    significance_source: str | None = None
    status: str = "unchanged"


@dataclass
class RegressResult:
    candidate_runs: list[int]
    baseline_runs: list[int]
    history_runs: list[int]
    verdicts: list[Verdict]
    frontier: FrontierVerdict | None
    overall: str  # regression | improvement | unchanged | no-baseline
    baseline_reason: str = ""
    notes: list[str] = field(default_factory=list)
    candidate_meta: dict = field(default_factory=dict)
    baseline_meta: dict = field(default_factory=dict)
    accuracy: list[dict] = field(default_factory=list)  # k2bench.harness.eval.gate.AccuracyVerdict as dicts
    capacity: dict | None = None  # k2bench.harness.analysis.capacity.CapacityVerdict as a dict (capacity runs)

    @property
    def regressions(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == "regression"]

    @property
    def improvements(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == "improvement"]

    def to_dict(self) -> dict:
        doc = asdict(self)
        doc["schema"] = "k2bench.regress/1"
        return _clean(doc)


def _clean(obj):
    """JSON-safe: NaN/inf become None, tuples lists, numpy scalars Python numbers."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def counted(points: pd.DataFrame) -> pd.DataFrame:
    """The levels that count: invalid ones are kept in the store but never compared or scanned."""
    if "valid" not in points.columns:
        return points
    return points[points["valid"].fillna(False).astype(bool)]


def _invalid_levels(cand: pd.DataFrame) -> dict[int, str]:
    """Candidate concurrencies with no valid trial, and why (the first reason stored)."""
    if "valid" not in cand.columns or len(cand) == 0:
        return {}
    ok = cand["valid"].fillna(False).astype(bool)
    good = set(cand.loc[ok, "concurrency"])
    out = {}
    for row in cand[~ok].itertuples():
        if row.concurrency not in good and int(row.concurrency) not in out:
            out[int(row.concurrency)] = getattr(row, "invalid_reason", None) or "no reason stored"
    return out


def per_run(points: pd.DataFrame, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    """One row per (run_id, concurrency): trials reduced as everywhere (catalogue.over_trials); ``columns``
    default to the default gated metrics (the frontier's among them)."""
    return over_trials(points, columns or [m.column for m in METRICS])


def request_samples(requests: pd.DataFrame | None, concurrency: int, rule: str | None) -> np.ndarray | None:
    """Per-request values that move with a metric (same direction), for the rank test.

    ``rule`` is the metric's catalogue sample rule; None (no per-request sample) gives None."""
    if rule is None or requests is None or len(requests) == 0:
        return None
    df = requests[(requests["concurrency"] == concurrency)]
    if rule == "slo_good":  # every measured request, failed ones as not good; absent: no SLO applies
        return df["slo_good"].to_numpy(float) if "slo_good" in df.columns else None
    if "success" in df.columns:
        df = df[df["success"].astype(bool)]
    if rule == "output_rate":  # tokens per second of one request: throughput at fixed concurrency
        vals = df["output_tokens"].astype(float) / df["e2el_ms"].astype(float)
    elif rule == "inv_output_rate":  # time per output token of one request: cost per token at one price
        vals = df["e2el_ms"].astype(float) / df["output_tokens"].astype(float)
    elif rule == "inv_tpot":
        vals = 1000.0 / df["tpot_ms"].astype(float)
    elif rule == "hit_share":  # the share of one request's prompt found in the prefix cache
        vals = df["cached_tokens"].astype(float) / df["prompt_tokens"].astype(float)
    else:
        vals = df[rule].astype(float)
    arr = vals.to_numpy()
    return arr[np.isfinite(arr)]


def _judge(worse_by: float, thr: float, significant: bool | None) -> str:
    if not math.isfinite(worse_by):
        return "missing"
    if abs(worse_by) <= thr:
        return "unchanged"
    if significant is None:
        return "unconfirmed"
    if not significant:
        return "noise"
    return "regression" if worse_by > 0 else "improvement"


def _compare_kind(cand: pd.DataFrame, base: pd.DataFrame, hist: pd.DataFrame, cand_requests: pd.DataFrame | None,
                  base_requests: pd.DataFrame | None, cfg: RegressConfig):
    """(verdicts, notes, frontier verdict) of the levels of one kind, keyed by concurrency."""
    invalid = _invalid_levels(cand)
    cand, base, hist = counted(cand), counted(base), counted(hist)
    judged = cfg.judged()
    cols = tuple(dict.fromkeys([*cfg.metrics, *(FRONTIER_METRICS if cfg.judges_frontier else ())]))
    c_run, b_run, h_run = per_run(cand, cols), per_run(base, cols), per_run(hist, cols) if len(hist) else None
    notes = []
    c_levels, b_levels = set(c_run["concurrency"]), set(b_run["concurrency"])
    for side, only in (("candidate", c_levels - b_levels), ("baseline", b_levels - c_levels)):
        if only:
            notes.append(f"concurrency {', '.join(map(str, sorted(only)))} only in the {side}; not compared")
    verdicts = []
    for conc, reason in sorted(invalid.items()):
        notes.append(f"concurrency {conc}: the candidate's level is invalid ({reason}); reported as invalid, "
                     f"never as a regression or an improvement")
        verdicts += [Verdict(m.column, m.label, conc, m.higher_is_better, math.nan, math.nan, math.nan, math.nan,
                             cfg.threshold_for(m.column), status="invalid") for m in judged]
    for conc in sorted(c_levels & b_levels):
        for m in judged:
            if _no_data(cand, m.column) and _no_data(base, m.column):
                # not measured on either side (e.g. J/token without GPU telemetry): not applicable, unless the
                # user chose the metric, who is told (a "missing" verdict here, a note in compare)
                if m.column in cfg.named:
                    verdicts.append(Verdict(m.column, m.short, int(conc), m.higher_is_better, math.nan, math.nan,
                                            math.nan, math.nan, cfg.threshold_for(m.column), status="missing"))
                continue
            verdicts.append(_verdict(m, int(conc), cand, base, c_run, b_run, h_run, cand_requests,
                                     base_requests, cfg))
    fv = _frontier_verdict(c_run, b_run, h_run, verdicts, cfg) if cfg.judges_frontier else None
    return verdicts, notes, fv


def _no_data(frame: pd.DataFrame, column: str) -> bool:
    return column not in frame.columns or bool(frame[column].isna().all())


def _kinds(*frames: pd.DataFrame) -> list[tuple[str, float | None]]:
    """The level kinds (mode, rate) the frames hold, closed first; frames from before rate levels are closed."""
    found: set[tuple[str, float | None]] = set()
    for f in frames:
        if f is None or not len(f):
            continue
        if "mode" not in f.columns:
            found.add(("closed", None))
            continue
        for mode, rate in zip(f["mode"].fillna("closed"), f["rate"], strict=True):
            found.add((mode, None if mode == "closed" or pd.isna(rate) else float(rate)))
    return sorted(found, key=lambda k: (k[0] != "closed", k[1] or 0.0)) or [("closed", None)]


def _of_kind(frame: pd.DataFrame | None, kind: tuple[str, float | None]) -> pd.DataFrame | None:
    """The rows of one level kind (a frame without a mode column holds closed levels only)."""
    if frame is None:
        return None
    if "mode" not in frame.columns:
        return frame if kind[0] == "closed" else frame.iloc[0:0]
    mode = frame["mode"].fillna("closed")
    if kind[0] == "closed":
        return frame[mode == "closed"]
    return frame[(mode == kind[0]) & (frame["rate"] == kind[1])]


def compare(cand: pd.DataFrame, base: pd.DataFrame, history: pd.DataFrame | None = None,
            cand_requests: pd.DataFrame | None = None, base_requests: pd.DataFrame | None = None,
            config: RegressConfig | None = None) -> RegressResult:
    """Compare candidate points against baseline points (both points_frame-shaped), each level kind on its
    own: closed levels by concurrency (and as a frontier), each rate's levels by their in-flight cap."""
    cfg = config or RegressConfig()
    cfg.validate()
    cand_runs = sorted(int(r) for r in cand["run_id"].unique())
    base_runs = sorted(int(r) for r in base["run_id"].unique())
    hist = history if history is not None else base.iloc[0:0]
    hist = hist[~hist["run_id"].isin(cand_runs)]
    hist_runs = sorted(int(r) for r in counted(hist)["run_id"].unique())
    verdicts: list[Verdict] = []
    notes: list[str] = []
    fv = None
    for kind in _kinds(cand, base):
        v, n, f = _compare_kind(_of_kind(cand, kind), _of_kind(base, kind), _of_kind(hist, kind),
                                _of_kind(cand_requests, kind), _of_kind(base_requests, kind), cfg)
        for one in v:
            one.mode, one.rate = kind
        verdicts += v
        notes += n if kind[0] == "closed" else [f"rate {kind[1]:g}/s: {text}" for text in n]
        if kind[0] == "closed":
            fv = f  # the frontier is the closed loop's (tok/s/GPU against tok/s/user over concurrency)
    statuses = {v.status for v in verdicts} | ({fv.status} if fv else set())
    overall = ("regression" if "regression" in statuses else
               "improvement" if "improvement" in statuses else "unchanged")
    for name in cfg.named:
        if not any(v.metric == name and v.status not in ("missing", "invalid") for v in verdicts):
            notes.append(f"{name} (chosen with --gate-metric) has no value on both sides at any level they share; "
                         f"not judged")
    unconfirmed = sum(1 for v in verdicts if v.status == "unconfirmed") + (fv is not None and fv.status == "unconfirmed")
    if unconfirmed:
        k = next(k for k in range(2, 64) if stats.min_mann_whitney_p(k, k) < cfg.alpha)
        notes.append(f"{unconfirmed} change(s) unconfirmed (shown, never failing the gate): the requests of one run "
                     f"share its machine state, so they cannot confirm a change between runs; to confirm, sweep "
                     f"both sides with --trials {k} (or more), or keep at least {cfg.min_history} comparable "
                     f"baseline runs")
    return RegressResult(candidate_runs=cand_runs, baseline_runs=base_runs, history_runs=hist_runs,
                         verdicts=verdicts, frontier=fv, overall=overall, notes=notes)


def _verdict(m: Metric, conc: int, cand, base, c_run, b_run, h_run, cand_req, base_req,
             cfg: RegressConfig) -> Verdict:
    def col(frame):
        return frame.loc[frame["concurrency"] == conc, m.column].dropna().to_numpy(float)

    h_vals = col(h_run) if h_run is not None else None
    cs, bs = request_samples(cand_req, conc, m.sample), request_samples(base_req, conc, m.sample)
    return decide(m, conc, col(b_run), col(c_run), h_vals, col(base), col(cand), bs, cs, cfg)


def decide(m: Metric, conc: int, b_vals: np.ndarray, c_vals: np.ndarray, h_vals: np.ndarray | None,
           b_trials: np.ndarray, c_trials: np.ndarray, b_samples: np.ndarray | None,
           c_samples: np.ndarray | None, cfg: RegressConfig) -> Verdict:
    """The verdict for one metric at one level from plain arrays (per-run values, trials, requests).

    bench/regress_bench.py calls this directly, so the simulated rates are those of the real rule.
    """
    thr = cfg.threshold_for(m.column)
    if len(c_vals) == 0 or len(b_vals) == 0:
        return Verdict(m.column, m.short, conc, m.higher_is_better, math.nan, math.nan, math.nan,
                       math.nan, thr, status="missing")
    c_center, b_center = stats.center(c_vals), stats.center(b_vals)
    eff = stats.effect(b_center, c_center, m.higher_is_better)
    v = Verdict(m.column, m.short, conc, m.higher_is_better, b_center, c_center, eff.rel_change,
                eff.worse_by, thr, factor=stats.effect_factor(b_center, c_center, m.higher_is_better))
    tests = []
    if h_vals is not None and len(h_vals) >= cfg.min_history:
        nt = stats.noise_test(h_vals, b_center, c_center, n_baseline=len(stats.screened(b_vals)),
                              n_candidate=len(stats.screened(c_vals)))
        v.noise_p, v.noise_z = nt.p_value, nt.z
        tests.append(nt.p_value)
    alternative = "greater" if eff.rel_change > 0 else "less"
    rank = None
    if (len(c_trials) >= 2 and len(b_trials) >= 2
            and stats.min_mann_whitney_p(len(b_trials), len(c_trials)) < cfg.alpha):
        rank, v.mw_source = stats.mann_whitney(b_trials, c_trials, alternative), "trials"
    elif (c_samples is not None and b_samples is not None
          and min(len(c_samples), len(b_samples)) >= cfg.min_request_samples):
        rank, v.mw_source = stats.mann_whitney(b_samples, c_samples, alternative), "requests"
    if rank is not None:
        v.mw_p = rank.p_value
        # One run's requests share its machine state (load, clocks, thermals): they are not independent
        # evidence of a change between runs. They confirm only beside a noise history of enough runs.
        if v.mw_source == "trials" or v.noise_p is not None:
            tests.append(rank.p_value)
    else:
        v.mw_source = None
    v.significant = all(p < cfg.alpha for p in tests) if tests else None
    v.status = _judge(v.worse_by, thr, v.significant)
    return v


def _median_points(run_frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    med = run_frame.groupby("concurrency")[["interactivity_median", "tput_per_gpu"]].median()
    return med["interactivity_median"].to_numpy(float), med["tput_per_gpu"].to_numpy(float)


def _frontier_verdict(c_run, b_run, h_run, verdicts: list[Verdict], cfg: RegressConfig):
    if not {"interactivity_median", "tput_per_gpu"} <= set(c_run.columns):
        return None
    bx, by = _median_points(b_run)
    cx, cy = _median_points(c_run)
    comp = pareto.compare_frontiers(bx, by, cx, cy)
    thr = cfg.frontier_threshold or cfg.thresholds.get("frontier") or cfg.threshold_for("tput_per_gpu")
    fv = FrontierVerdict(comparison=comp, threshold=thr)
    if comp.overlap is None:
        fv.status = "missing"
        return fv
    shift = comp.shift
    if h_run is not None:
        shifts = []
        for _rid, g in h_run.groupby("run_id"):
            hc = pareto.compare_frontiers(bx, by, *_median_points(g))
            if hc.overlap is not None:
                shifts.append(hc.shift)
        if len(shifts) >= cfg.min_history:
            nt = stats.noise_test(shifts, 0.0, shift, n_baseline=b_run["run_id"].nunique(), min_sigma=0.002)
            fv.noise_p, fv.significant, fv.significance_source = nt.p_value, nt.p_value < cfg.alpha, "history"
    if fv.significant is None:
        # No history of frontier shifts: lean on the per-point tests of the two frontier metrics.
        same_way = [v for v in verdicts if v.metric in ("tput_per_gpu", "interactivity_median")
                    and v.significant and math.isfinite(v.worse_by) and (v.worse_by > 0) == (shift < 0)]
        if same_way:
            fv.significant, fv.significance_source = True, "per-point tests"
    fv.status = _judge(-shift, thr, fv.significant)
    return fv
