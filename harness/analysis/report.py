"""Regression reports: markdown that fits a PR comment, JSON for machines, a PNG of the frontiers.

Every stored string (names, commits, reasons, notes) goes through k2bench.harness.analysis.mdsafe before it
reaches the markdown, so a hostile run cannot inject HTML, mentions, headings or table columns.
The markdown starts with a hidden marker (``COMMENT_MARKER``) so the CI script can find and update
its own comment instead of adding a new one on every push.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from k2bench.harness.analysis.mdsafe import md_code, md_text
from k2bench.harness.analysis.regress import RegressResult, Verdict
from k2bench.harness.measure.catalogue import CATALOGUE

COMMENT_MARKER = "<!-- k2bench-regress -->"
MARKS = {"regression": "❌", "improvement": "✅", "noise": "~", "unconfirmed": "?", "unchanged": "",
         "missing": "n/a", "invalid": "invalid"}
HEADLINE = {"regression": "❌ **Regression**", "improvement": "✅ **Improvement**",
            "unchanged": "✅ **No significant change**", "no-baseline": "⚠️ **No comparable baseline**"}


def _pct(x: float | None, digits: int = 1) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    s = f"{100 * x:+.{digits}f}%"
    return s.replace("-", "−")


def _num(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}".replace("-", "−")
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _p(p: float | None) -> str:
    if p is None or not math.isfinite(p):
        return "–"
    return "<1e-4" if p < 1e-4 else f"{p:.4f}"


def _peq(p: float | None) -> str:
    text = _p(p)
    return text if text.startswith("<") else f"={text}"


def _short(commit) -> str:
    return md_code(str(commit)[:10]) if commit else "(no commit)"


def _level(v: Verdict) -> str:
    """A verdict's level in the report: the concurrency of a closed level, r<rate>/s (cap N) of a rate level."""
    return str(v.concurrency) if v.mode == "closed" else f"{v.level} (cap {v.concurrency})"


def _describe(v: Verdict) -> str:
    where = (f"{v.label} {_pct(v.rel_change)} at concurrency {v.concurrency}" if v.mode == "closed"
             else f"{v.label} {_pct(v.rel_change)} at {_level(v)}")
    ps = [f"noise p{_peq(v.noise_p)}" if v.noise_p is not None else "",
          f"Mann-Whitney p{_peq(v.mw_p)}" if v.mw_p is not None else ""]
    ps = [p for p in ps if p]
    return where + (f" ({', '.join(ps)})" if ps else "")


def _md_reason(text: str) -> str:
    return md_text(text, 600)


def verdict_line(res: RegressResult, esc: Callable[[str], str] = _md_reason) -> str:
    """The one-line verdict: markdown by default; ``esc=str`` for a console (stored text left as is)."""
    head = HEADLINE.get(res.overall, res.overall)
    failed_accuracy = [esc(a["reason"]) for a in res.accuracy if a["status"] == "regression"]
    if res.overall == "no-baseline" or (failed_accuracy and not res.baseline_runs):
        return f"{head}: " + "; ".join(failed_accuracy + [esc(res.baseline_reason)])
    fr = res.frontier
    parts = []
    cap = [_capacity_text(res.capacity)] if res.capacity and res.capacity["status"] in (
        "regression", "improvement") else []
    if res.overall == "regression":
        worst = sorted(res.regressions, key=lambda v: -v.worse_by)
        parts = failed_accuracy + cap + [_describe(v) for v in worst[:3]]
        if len(worst) > 3:
            parts.append(f"and {len(worst) - 3} more")
        if fr and fr.status == "regression":
            parts.insert(0, f"frontier {_pct(fr.comparison.shift)} tok/s/GPU at matched tok/s/user")
    elif res.overall == "improvement":
        best = sorted(res.improvements, key=lambda v: v.worse_by)
        parts = cap + [_describe(v) for v in best[:3]]
        if fr and fr.status == "improvement":
            parts.insert(0, f"frontier {_pct(fr.comparison.shift)} tok/s/GPU at matched tok/s/user")
    else:
        n = len(res.verdicts)
        parts = [f"{n} metric/concurrency comparisons within thresholds or noise"]
    return f"{head}: " + "; ".join(parts)


def markdown(res: RegressResult, png_name: str | None = None) -> str:
    """The PR comment. ``png_name`` is linked relative to the markdown file when given."""
    lines = [COMMENT_MARKER, "### k2bench regression check", "", verdict_line(res), ""]
    cm, bm = res.candidate_meta, res.baseline_meta
    cand_ids = ", ".join(f"#{r}" for r in res.candidate_runs)
    lines.append(f"Candidate {_short(cm.get('commit'))} (run {cand_ids})"
                 + (f" vs baseline {_short(bm.get('commit'))} (run {', '.join(f'#{r}' for r in res.baseline_runs)})"
                    if res.baseline_runs else ""))
    if cm:
        cfg = ", ".join(f"{k}={md_text(cm[k])}" for k in ("engine", "model", "hardware", "tp", "isl", "osl") if cm.get(k) is not None)
        lines.append(f"Configuration: {cfg}")
    if res.baseline_reason and res.overall != "no-baseline":
        lines.append(f"Baseline: {_md_reason(res.baseline_reason)}")
    if res.history_runs:
        lines.append(f"Noise history: {len(res.history_runs)} run(s)")
    lines.append("")
    if res.overall == "no-baseline" or not res.baseline_runs:
        lines += _accuracy_section(res)
        return "\n".join(lines).rstrip() + "\n"
    lines += _accuracy_section(res)
    lines += _capacity_section(res)
    lines += _delta_table(res)
    lines += _frontier_section(res, png_name)
    lines += _details(res)
    for note in res.notes:
        lines.append(f"- {_md_reason(note)}")
    return "\n".join(lines).rstrip() + "\n"


def _accuracy_section(res: RegressResult) -> list[str]:
    if not res.accuracy:
        return []
    out = ["| accuracy | baseline | candidate | n | threshold | p (drop) | status |", "|---|---:|---:|---:|---:|---:|---|"]
    for a in res.accuracy:
        base = "–" if a["baseline"] is None else f"{a['baseline']:.3f}"
        thr = "–" if a["threshold"] is None else f"{a['threshold']:.2f}"
        out.append(f"| {md_text(a['task'])} | {base} | {a['candidate']:.3f} | {a['n_candidate']} | {thr} | "
                   f"{_p(a['p_value'])} | {MARKS.get(a['status'], '')} {a['status']} |")
    return out + ["", "Accuracy: the model's threshold, and a one-sided two-proportion test on the per-item "
                      "scores (a drop counts when it is at least 1 point and significant at 5%).", ""]


def _capacity_text(c: dict) -> str:
    change = "" if c["rel_change"] is None else f" ({_pct(c['rel_change'])})"
    def load(x: float | None) -> str:
        return "none" if x is None else f"{x:g}"

    return (f"capacity {load(c['baseline'])} -> {load(c['candidate'])} by {c['by']} at SLO "
            f"{md_text(c['slo'])}{change}")


def _capacity_section(res: RegressResult) -> list[str]:
    c = res.capacity
    if not c:
        return []
    return [f"Capacity (highest load with at least {100 * c['target']:g}% of requests meeting the SLO): "
            f"{_capacity_text(c)}: {MARKS.get(c['status'], '')} {c['status']}; {_md_reason(c['evidence'])}", ""]


def _delta_table(res: RegressResult) -> list[str]:
    # the judged metrics (the default gated set, or those --gate-metric chose), in catalogue order
    judged = {v.metric for v in res.verdicts}
    metrics = [m for m in CATALOGUE if m.column in judged]
    concs = sorted({(v.mode != "closed", v.rate or 0.0, v.concurrency, _level(v)) for v in res.verdicts})
    by = {(v.metric, _level(v)): v for v in res.verdicts}
    out = ["| conc | " + " | ".join(m.short for m in metrics) + " |",
           "|---:|" + "---:|" * len(metrics)]
    for *_, c in concs:
        cells = []
        for m in metrics:
            v = by.get((m.column, c))
            if v is not None and v.status == "invalid":
                cells.append("invalid")
            else:
                cells.append("n/a" if v is None else f"{_pct(v.rel_change)} {MARKS[v.status]}".strip())
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    thr_text = ", ".join(sorted({f"{100 * v.threshold:g}%" for v in res.verdicts}))
    out += ["", f"Change of candidate vs baseline (higher is better for tok/s/GPU and tok/s/user, lower for "
                f"latencies). ❌ regression / ✅ improvement: beyond the threshold ({thr_text}) and significant; "
                f"~ beyond the threshold but within noise; ? beyond the threshold, significance unknown.", ""]
    return out


def _frontier_section(res: RegressResult, png_name: str | None) -> list[str]:
    fr = res.frontier
    if fr is None:
        return []
    c = fr.comparison
    out = ["**Frontier** (tok/s/GPU at matched tok/s/user, log-log interpolation)"]
    if c.overlap is None:
        out += ["", "The two frontiers do not overlap in interactivity (or have fewer than two points); "
                    "no matched comparison.", ""]
    else:
        mark = MARKS.get(fr.status, "")
        sig = f"; significance from {fr.significance_source}" if fr.significance_source else ""
        out += ["", f"Over {_num(c.overlap[0])}–{_num(c.overlap[1])} tok/s/user: "
                    f"{_pct(c.shift)} geometric mean{' ' + mark if mark else ''} (worst {_pct(c.min_ratio - 1)} at "
                    f"{_num(c.min_ratio_at)} tok/s/user, best {_pct(c.max_ratio - 1)}); area between frontiers "
                    f"{_num(c.area_between)} tok/s/GPU·ln(tok/s/user); threshold {100 * fr.threshold:g}%{sig}.",
                "", "| tok/s/user | baseline tok/s/GPU | candidate tok/s/GPU | ratio |", "|---:|---:|---:|---:|"]
        for m in c.matched:
            out.append(f"| {_num(m['interactivity'])} | {_num(m['baseline'])} | {_num(m['candidate'])} | "
                       f"{m['ratio']:.3f} |")
        out.append("")
    if png_name:
        out += [f"![frontiers]({png_name})", ""]
    return out


def _details(res: RegressResult) -> list[str]:
    out = ["<details><summary>All comparisons</summary>", "",
           "| metric | conc | baseline | candidate | change | noise p | Mann-Whitney p | status |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for v in res.verdicts:
        mw = f"{_p(v.mw_p)} ({v.mw_source})" if v.mw_p is not None else "–"
        out.append(f"| {v.label} | {_level(v)} | {_num(v.baseline)} | {_num(v.candidate)} | "
                   f"{_pct(v.rel_change)} | {_p(v.noise_p)} | {mw} | {v.status} |")
    out += ["", "</details>", ""]
    return out


def to_json(res: RegressResult) -> str:
    return json.dumps(res.to_dict(), indent=2, sort_keys=True, default=str) + "\n"


def frontier_png(res: RegressResult, path: str | Path, cand_points=None, base_points=None) -> Path | None:
    """Plot both frontiers (and all points, when given as (x, y, conc) lists) with matplotlib Agg."""
    if res.frontier is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = res.frontier.comparison
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for name, front, pts, color in (("baseline", c.baseline, base_points, "tab:blue"),
                                    ("candidate", c.candidate, cand_points, "tab:red")):
        if pts:
            xs, ys, cs = zip(*pts, strict=True)
            ax.scatter(xs, ys, s=14, color=color, alpha=0.35)
            labelled = set()
            for x, y, k in pts:  # one label per concurrency (several baseline runs share levels)
                if k not in labelled:
                    labelled.add(k)
                    ax.annotate(f"c{k}", (x, y), fontsize=7, color=color, xytext=(3, 3), textcoords="offset points")
        if front:
            fx, fy = zip(*front, strict=True)
            ax.plot(fx, fy, "o-", color=color, label=f"{name} frontier")
    if c.overlap:
        ax.axvspan(*c.overlap, color="grey", alpha=0.08, label="compared range")
    from matplotlib.ticker import ScalarFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(ScalarFormatter())
        axis.get_major_formatter().set_scientific(False)
        axis.get_minor_formatter().set_scientific(False)
    ax.set_xlabel("interactivity (tok/s/user)")
    ax.set_ylabel("throughput (tok/s/GPU)")
    ax.set_title(f"Frontier shift {_pct(c.shift)} at matched interactivity" if c.overlap else "Frontiers")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
