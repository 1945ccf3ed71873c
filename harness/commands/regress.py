"""`k2bench regress` (the PR gate) and `k2bench changepoints` (the nightly history scan)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness.commands.common import add_db_arg

# Defaults live in the dataclasses of k2bench.harness.analysis; these mirror them for --help only
# and are read from there at run time (see _config / _options).


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("regress", help="compare a run or commit with its baseline; PR gate",
                       description="Verdict per metric and concurrency plus the frontier comparison. "
                                   "Exit 1 on a regression with --fail-on-regression.")
    p.add_argument("--candidate", required=True, metavar="RUN|SHA", help="run id or commit (or git revision)")
    p.add_argument("--baseline", default="auto", metavar="RUN|SHA|auto",
                   help="explicit baseline, or auto: merge-base with the default branch, else its latest runs")
    p.add_argument("--baseline-mode", default=None, choices=["auto", "merge-base", "latest"],
                   help="how auto picks the baseline (default auto)")
    p.add_argument("--default-branch", default=None, help="default branch name (default main)")
    p.add_argument("--repo", default=None, help="git work tree for merge-base (default: current directory)")
    p.add_argument("--baseline-runs", type=int, default=None, help="latest mode: runs in the baseline (default 5)")
    p.add_argument("--history", type=int, default=None, help="runs of noise history (default 10)")
    p.add_argument("--threshold", action="append", default=[], metavar="[METRIC=]FRACTION",
                   help="relative change that matters: 0.05 or 5%% for all, or e.g. ttft_ms_p99=0.1 (repeatable)")
    p.add_argument("--alpha", type=float, default=None, help="significance level, one-sided (default 0.01)")
    add_gate_metric_arg(p, "judged")
    p.add_argument("--no-requests", action="store_true", help="skip per-request samples (faster on huge runs)")
    p.add_argument("--slo", metavar="NAME=MS,...",
                   help="judge SLO attainment and goodput against this SLO on both sides, computed from the stored "
                        "requests (default: the SLO the candidate was swept under, if any)")
    p.add_argument("--format", choices=["md", "json"], default="md")
    p.add_argument("--out", default=None, help="write the report here (markdown also writes <stem>.png beside it)")
    p.add_argument("--json", dest="json_out", default=None, metavar="PATH",
                   help="also write the JSON verdict here (one comparison, both outputs)")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when a regression is found")
    add_db_arg(p)
    p.set_defaults(handler=_regress)

    c = sub.add_parser("changepoints", help="change points in each metric's history on a branch",
                       description="E-divisive means with a pooled-variance t-test check (see k2bench.harness.analysis."
                                   "changepoints); stores them for the dashboard.")
    c.add_argument("--branch", default="main")
    c.add_argument("--fingerprint", default=None, help="one configuration (default: every one on the branch)")
    c.add_argument("--window", type=int, default=None, help="points per window (default 50)")
    c.add_argument("--pvalue", type=float, default=None, help="t-test p-value a change must beat (default 0.001)")
    c.add_argument("--metric", action="append", default=None,
                   help="catalogue metric to scan (repeatable; the same as a plain --gate-metric NAME)")
    add_gate_metric_arg(c, "scanned")
    c.add_argument("--no-store", action="store_true", help="list only; do not replace stored change points")
    add_db_arg(c)
    c.set_defaults(handler=_changepoints)


def add_gate_metric_arg(p: argparse.ArgumentParser, verb: str) -> None:
    p.add_argument("--gate-metric", action="append", default=None, metavar="[+]NAME[,...]",
                   help=f"metrics {verb} (repeatable, comma-separated): a plain NAME replaces the default set "
                        f"(the catalogue's gated metrics), +NAME adds to it; any catalogue metric, e.g. "
                        f"+steady_tput_per_gpu")


def gate_selection(args):
    """The metrics chosen by --gate-metric (and, for changepoints, --metric: plain names)."""
    from k2bench.harness.analysis import gate_metrics

    values = [*(getattr(args, "metric", None) or []), *(args.gate_metric or [])]
    return gate_metrics.parse(values)


def parse_thresholds(values: list[str]) -> tuple[float | None, dict[str, float]]:
    """'5%', '0.05', 'ttft_ms_p99=10%' -> (global, per-metric)."""
    glob, per = None, {}
    for raw in values:
        name, _, val = raw.rpartition("=")
        text = val.strip()
        try:
            num = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise UserError(f"--threshold {raw!r}: expected a fraction (0.05), a percentage (5%), "
                            "or METRIC=value") from None
        if name:
            per[name.strip()] = num
        else:
            glob = num
    return glob, per


def _config(args):
    from k2bench.harness.analysis.regress import RegressConfig

    sel = gate_selection(args)
    cfg = RegressConfig(metrics=sel.metrics, named=sel.named)
    glob, per = parse_thresholds(args.threshold)
    if glob is not None:
        cfg.threshold = glob
    cfg.thresholds.update(per)
    if args.alpha is not None:
        cfg.alpha = args.alpha
    try:
        cfg.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return cfg


def _options(args):
    from k2bench.harness.analysis.baseline import BaselineOptions

    opts = BaselineOptions(repo=args.repo)
    for attr, val in (("mode", args.baseline_mode), ("default_branch", args.default_branch),
                      ("baseline_runs", args.baseline_runs), ("history_limit", args.history)):
        if val is not None:
            setattr(opts, attr, val)
    opts.validate()
    return opts


def _open(url, readonly=False):
    from k2bench.harness.store import Store

    return Store.open(url, readonly=readonly)


def _regress(args) -> int:
    from k2bench.harness.analysis import report
    from k2bench.harness.analysis.gate import run_gate

    cfg, opts = _config(args), _options(args)
    if args.slo:
        from k2bench.harness.measure.slo import parse_slo

        parse_slo(args.slo)  # a typo is refused before the store is read
    store = _open(args.db, readonly=True)
    out = run_gate(store, args.candidate, args.baseline, opts, cfg, use_requests=not args.no_requests,
                   slo=args.slo)
    res = out.result
    section, prof_doc = None, None
    if res.overall == "regression":  # both sides profiled (--profile-level): where the time went
        from k2bench.harness.analysis.profile_diff import verdict_profiles

        section, prof_doc = verdict_profiles(store, res.baseline_runs, res.candidate_runs, "baseline", "candidate")
    if args.format == "json":
        text = _json(res, prof_doc)
    else:
        png_name = None
        if args.out:
            png = Path(args.out).with_suffix(".png")
            if report.frontier_png(res, png, out.cand_points, out.base_points):
                png_name = png.name
        text = report.markdown(res, png_name)
        if section:
            text = text.rstrip() + "\n\n" + section
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
        print(report.verdict_line(res, esc=str))
        print(f"report written to {args.out}")
    else:
        sys.stdout.write(text)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(_json(res, prof_doc), encoding="utf-8")
    return 1 if (args.fail_on_regression and res.overall == "regression") else 0


def _json(res, profiles: dict | None) -> str:
    """The verdict's JSON, with both sides' profiles and their kernel-time diff when there are some."""
    from k2bench.harness.analysis import report

    text = report.to_json(res)
    if not profiles:
        return text
    import json

    return json.dumps({**json.loads(text), "profiles": profiles}, indent=2, sort_keys=True, default=str) + "\n"


def _changepoints(args) -> int:
    from k2bench.harness.analysis import changepoints as cp

    window = args.window if args.window is not None else cp.DEFAULT_WINDOW
    pvalue = args.pvalue if args.pvalue is not None else cp.DEFAULT_PVALUE
    if window < 2 * cp.DEFAULT_MIN_SIZE:
        raise UserError(f"--window must be at least {2 * cp.DEFAULT_MIN_SIZE}")
    if not 0 < pvalue < 1:
        raise UserError("--pvalue must be between 0 and 1")
    store = _open(args.db, readonly=True)  # a missing database is an error, not a new empty one
    writer = None
    from k2bench.harness.analysis.baseline import usable

    runs = [r for r in store.list_runs(branch=args.branch) if usable(r)]
    fps = sorted({r.get("fingerprint") for r in runs if r.get("fingerprint")})
    if args.fingerprint:
        if args.fingerprint not in fps:
            raise UserError(f"no usable runs of fingerprint {args.fingerprint!r} on branch {args.branch!r}")
        fps = [args.fingerprint]
    if not fps:
        print(f"no usable runs on branch {args.branch!r}; nothing to scan")
        return 0
    sel = gate_selection(args)
    metrics = sel.metrics
    for fp in fps:
        ids = [r["id"] for r in runs if r.get("fingerprint") == fp]
        pts = _slo_judged(store, store.points_frame(run_ids=ids), [r for r in runs if r.get("fingerprint") == fp])
        try:
            rows = cp.history_change_points(pts, metrics, window, pvalue)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if not args.no_store:
            writer = writer or _open(args.db)
            kept = _unscanned_change_points(writer, fp, args.branch, metrics)
            writer.replace_change_points(fp, args.branch, kept + rows)
        print(f"{_series_name(r for r in runs if r.get('fingerprint') == fp)} (fingerprint {fp[:12]}): "
              f"{len(ids)} run(s), {len(rows)} change point(s)" + _runs_needed(len(ids)))
        for r in sorted(rows, key=lambda r: (r["metric"], r["concurrency"], r["run_id"])):
            print(f"  {r['metric']:<22} conc {r['concurrency']:<5} run #{r['run_id']:<6} "
                  f"{str(r['commit'] or '')[:10]:<10} {r['mean_before']:>12.4g} -> {r['mean_after']:<12.4g} "
                  f"{100 * r['rel_change']:+6.1f}%  p={r['p_value']:.2g}")
        for name in cp.without_values(pts, sel.named):
            print(f"  {name:<22} no value in this series (chosen with --gate-metric or --metric); not scanned")
    return 0


def _slo_judged(store, pts, runs: list[dict]):
    """A series' SLO figures under one SLO, its newest run's (runs come newest first): levels swept under
    another SLO, or none, are recomputed from their stored requests, so a change of SLO is no change point."""
    from k2bench.harness.analysis.slo_view import with_slo
    from k2bench.harness.measure.slo import FIELDS, parse_slo

    newest = next((r["slo"] for r in runs if r.get("slo")), None)
    if newest is None:
        return pts.assign(**{c: float("nan") for c in FIELDS})
    return with_slo(store, pts, parse_slo(newest))


def _series_name(runs) -> str:
    """A series named by what it measures (engine, model, hardware, workload), not by its hash."""
    r = next(iter(runs), {})
    parts = [r.get("engine"), r.get("model"), r.get("precision"), r.get("hardware"),
             f"TP{r['tp']}" if r.get("tp") else None, r.get("workload")]
    return " · ".join(str(p) for p in parts if p) or "unnamed configuration"


def _runs_needed(n: int) -> str:
    """What a series too short to scan lacks: a change needs DEFAULT_MIN_SIZE runs on each side."""
    from k2bench.harness.analysis import changepoints as cp

    need = 2 * cp.DEFAULT_MIN_SIZE
    return "" if n >= need else f"; finding a change needs at least {need} runs ({need - n} more)"


def _unscanned_change_points(store, fingerprint: str, branch: str, scanned) -> list[dict]:
    """Stored change points of the metrics this scan did not look at.

    replace_change_points replaces a whole (fingerprint, branch) series, so a scan of one metric
    (--metric) must hand the other metrics' change points back or it would delete them."""
    old = store.change_points_frame(fingerprint=fingerprint, branch=branch)
    old = old[~old["metric"].isin(scanned)]
    fields = ["metric", "concurrency", "run_id", "commit", "detected_at", "mean_before", "mean_after",
              "rel_change", "p_value"]
    old = old[fields].astype(object)
    return old.where(old.notna(), None).to_dict("records")
