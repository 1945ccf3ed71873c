"""Capacity between commits: is the candidate's capacity at the SLO lower than the baseline's, and do
the probes show it?

A capacity search reports a load ``c`` that met the target and, above it, one that missed; its answer
is only as sharp as its bracket and its probes' binomial intervals. So a drop counts as a regression
only when it is both large and shown by the probes:

- large: (baseline - candidate) / baseline > the threshold, and at least the wider of the two searches'
  tolerances (a change below a search's resolution cannot be seen);
- shown: the candidate missed the target at a load the baseline met (a candidate probe at a load at or
  below the baseline's capacity whose attainment interval lies wholly below the target).

A drop that is large but not shown is "unconfirmed" (reported, never failing the gate); an A/A rerun
gives the same capacity, or one a probe away that no confidently missed probe supports. Improvements
are judged the mirror way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class CapacityVerdict:
    by: str
    slo: str
    target: float
    baseline: float | None
    candidate: float | None
    baseline_run: int | None
    candidate_run: int | None
    rel_change: float | None  # (candidate - baseline) / baseline
    threshold: float
    evidence: str  # the probe that shows the change, or why none does
    status: str  # regression | improvement | unchanged | unconfirmed | missing


def stored_capacity(run: dict) -> dict | None:
    cap = (run.get("extra") or {}).get("capacity")
    return cap if isinstance(cap, dict) and "capacity" in cap and cap.get("probes") else None


def _shown_miss(missed_side: dict, load: float) -> dict | None:
    """The probe of ``missed_side``'s search that surely missed the target at ``load`` or below."""
    target = missed_side["target"]
    misses = [p for p in missed_side["probes"] if p["load"] <= load and not p["meets"]
              and (p["high"] is not None and p["high"] < target or not p["valid"])]
    return max(misses, key=lambda p: p["load"], default=None)


def judge(cand: dict, base: dict, threshold: float, cand_run: int | None = None,
          base_run: int | None = None) -> CapacityVerdict:
    """The verdict on two stored search results (run extra.capacity)."""
    v = CapacityVerdict(by=cand["by"], slo=cand["slo"], target=cand["target"], baseline=base["capacity"],
                        candidate=cand["capacity"], baseline_run=base_run, candidate_run=cand_run,
                        rel_change=None, threshold=threshold, evidence="", status="missing")
    if (cand["by"], cand["slo"], cand["target"]) != (base["by"], base["slo"], base["target"]):
        v.evidence = (f"searches differ (by {base['by']} at {base['slo']}, target {base['target']:g} vs by "
                      f"{cand['by']} at {cand['slo']}, target {cand['target']:g}); not compared")
        return v
    b, c = base["capacity"] or 0.0, cand["capacity"] or 0.0
    if b == 0 and c == 0:
        v.evidence, v.status = "neither met the target at its lowest probe", "unchanged"
        return v
    v.rel_change = (c - b) / b if b else float("inf")
    need = max(threshold, cand.get("tolerance") or 0.0, base.get("tolerance") or 0.0)
    v.threshold = need
    if abs(v.rel_change) <= need:
        v.evidence, v.status = f"within {100 * need:g}%", "unchanged"
        return v
    worse = v.rel_change < 0
    missed_side, met_side, met_load = (cand, "baseline", b) if worse else (base, "candidate", c)
    probe = _shown_miss(missed_side, met_load)
    who = "candidate" if worse else "baseline"
    if probe is None:
        v.status = "unconfirmed"
        v.evidence = (f"no {who} probe at or below {met_load:g} (which the {met_side} met) missed the target "
                      f"with its interval wholly below {100 * v.target:g}%")
        return v
    v.status = "regression" if worse else "improvement"
    att = "invalid" if not probe["valid"] else (f"{100 * probe['attainment']:.1f}%, 95% CI up to "
                                                f"{100 * probe['high']:.1f}%")
    v.evidence = f"the {who} missed at {probe['load']:g} ({att}), a load the {met_side} met"
    return v


def compare_runs(cand_runs: Sequence[dict], base_runs: Sequence[dict], threshold: float) -> CapacityVerdict | None:
    """The latest candidate run with a capacity result against the latest such baseline run (None when
    either side has none: the candidate is no capacity run)."""
    cand = [(r, c) for r in cand_runs if (c := stored_capacity(r))]
    base = [(r, c) for r in base_runs if (c := stored_capacity(r))]
    if not cand:
        return None
    (c_run, c_cap) = max(cand, key=lambda rc: (rc[0].get("started_at") or "", rc[0]["id"]))
    if not base:
        return CapacityVerdict(by=c_cap["by"], slo=c_cap["slo"], target=c_cap["target"], baseline=None,
                               candidate=c_cap["capacity"], baseline_run=None, candidate_run=c_run["id"],
                               rel_change=None, threshold=threshold,
                               evidence="no baseline run has a capacity result", status="missing")
    same = [(r, c) for r, c in base if (c["by"], c["slo"], c["target"]) == (c_cap["by"], c_cap["slo"], c_cap["target"])]
    (b_run, b_cap) = max(same or base, key=lambda rc: (rc[0].get("started_at") or "", rc[0]["id"]))
    return judge(c_cap, b_cap, threshold, c_run["id"], b_run["id"])
