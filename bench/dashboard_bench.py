"""How long the dashboard's Frontier page takes to get its data and build its figure, at 2,000 runs.

A fresh SQLite database is filled with synthetic runs (k2bench.run/1 documents, upgraded on import
to version 2, through Store.import_run, summaries only): 4 configurations x 500 commits, 6 levels each (concurrency 4..128),
so 12,000 points. Then, uncached (what a page load costs once the 30 s cache has expired), the steps
of the Frontier page:

- query: the runs list (Store.list_runs + configuration labels), then the points of only the runs
  the view needs (Store.points_frame(run_ids=...)): the latest run of each configuration by default,
  every selected run for "median over runs in range",
- filter: the sidebar filters (one engine) and date range,
- figure: the page's table and Plotly figure (dashboard.views.frontier.build),
- json: the figure serialised as Streamlit sends it (fig.to_json()),
- page total: runs query + points query + figure, end to end.

Each step is timed several times; the table shows the median and the worst. Target: the default
view's query + figure under 1 s.

    python bench/dashboard_bench.py                 # table + results/bench/dashboard_bench.json
    python bench/dashboard_bench.py --runs 200 --repeats 3 --out /tmp/db.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from k2bench.dashboard import data
from k2bench.dashboard.reference import load_reference
from k2bench.dashboard.views.frontier import MODES, build, runs_to_load
from k2bench.harness.store import Store

LEVELS = (4, 8, 16, 32, 64, 128)
CONFIGS = [("bundled", "cpu"), ("bundled", "MI355X"), ("vllm", "MI355X"), ("atom", "MI355X")]
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def stats(mean: float) -> dict:
    return {"mean": mean, "median": mean, "std": mean * 0.05, "p90": mean * 1.2, "p99": mean * 1.5,
            "p99.9": mean * 1.6}


def run_doc(i: int, engine: str, hardware: str, commit_index: int) -> dict:
    drift = 1.0 + 0.0002 * commit_index  # slow improvement over history
    points = []
    for c in LEVELS:
        tpot = 5.0 * (1 + c / 16) / drift
        ttft = 50.0 + 3.0 * c
        e2el = ttft + 1023 * tpot
        points.append({"concurrency": c, "num_prompts": 10 * c, "completed": 10 * c, "failed": 0,
                       "duration_s": 10 * e2el / 1000, "tput_per_gpu": c * 9216 / (e2el / 1000) / 4,
                       "output_tput_per_gpu": c * 1024 / (e2el / 1000) / 4,
                       "input_tput_per_gpu": c * 8192 / (e2el / 1000) / 4,
                       "interactivity": {"median": 1000 / tpot, "p90": 900 / tpot, "p99": 800 / tpot},
                       "ttft_ms": stats(ttft), "tpot_ms": stats(tpot), "itl_ms": stats(tpot), "e2el_ms": stats(e2el)})
    run = {"engine": engine, "engine_version": "1.0", "model": "Kimi-K2.5", "precision": "mxfp4",
           "hardware": hardware, "num_gpus": 4, "tp": 4, "workload": "8k1k", "isl": 8192, "osl": 1024,
           "commit": f"{commit_index:08x}{i:032x}"[:40], "branch": "main",
           "started_at": (T0 + timedelta(hours=6 * commit_index, minutes=i % 60)).isoformat(),
           "status": "complete"}
    return {"schema": "k2bench.run/1", "run": run, "points": points}


def fill(url: str, runs: int) -> float:
    t = time.perf_counter()
    with Store.open(url) as store:
        for i in range(runs):
            engine, hardware = CONFIGS[i % len(CONFIGS)]
            store.import_run(run_doc(i, engine, hardware, i // len(CONFIGS)))
    return time.perf_counter() - t


def timed(fn, repeats: int) -> tuple[list[float], object]:
    out, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        out.append(time.perf_counter() - t)
    return out, result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="results/bench/dashboard_bench.json")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        fill_s = fill(url, args.runs)
        store = Store.open(url, readonly=True)
        ref = load_reference()
        rows = {}
        t_runs, runs = timed(lambda: data.load_runs(store), args.repeats)
        rows["query: runs (list_runs + labels)"] = t_runs
        first, last = runs["started_at"].min().date(), runs["started_at"].max().date()
        t_filter, selected = timed(lambda: data.filter_points(runs, {"engine": ["bundled"]}, (first, last)),
                                   args.repeats)
        rows["filter: one engine, date range"] = t_filter
        for mode in MODES:
            ids = runs_to_load(runs, mode)
            t_pts, points = timed(lambda ids=ids: data.load_points(store, ids), args.repeats)
            rows[f"query: points of {len(ids)} run(s) ({mode.lower()})"] = t_pts
            t_fig, (levels, fig) = timed(
                lambda points=points, mode=mode: build(points, "Throughput vs interactivity", mode, ref, False),
                args.repeats)
            rows[f"figure: {mode.lower()}"] = t_fig
            t_json, _ = timed(fig.to_json, args.repeats)
            rows[f"json: {mode.lower()}"] = t_json

        def page(mode: str):
            all_runs = data.load_runs(store)
            pts = data.load_points(store, runs_to_load(all_runs, mode))
            return build(pts, "Throughput vs interactivity", mode, ref, False)

        for mode in MODES:
            rows[f"page total, {mode.lower()}"] = timed(lambda mode=mode: page(mode), args.repeats)[0]
        store.close()

    n_points = args.runs * len(LEVELS)
    print(f"dashboard frontier page, {args.runs} runs / {n_points} points in SQLite "
          f"(filled in {fill_s:.1f} s), {args.repeats} repeats")
    print(f"{'step':52} {'median ms':>10} {'max ms':>9}")
    result = {}
    for name, ts in rows.items():
        med, worst = statistics.median(ts) * 1000, max(ts) * 1000
        result[name] = {"median_ms": round(med, 2), "max_ms": round(worst, 2)}
        print(f"{name:52} {med:10.1f} {worst:9.1f}")
    total = result[f"page total, {MODES[0].lower()}"]["median_ms"]
    print(f"target (default view): query + figure < 1000 ms -> {'met' if total < 1000 else 'NOT met'} "
          f"({total:.0f} ms median)")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": args.runs, "points": n_points, "repeats": args.repeats,
                               "fill_s": round(fill_s, 2), "steps": result, "target_ms": 1000,
                               "met": total < 1000, "host": platform.node(), "cpus": os.cpu_count(),
                               "python": platform.python_version()}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
