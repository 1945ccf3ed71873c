"""Simulated false-positive and detection rates of the regression gate and the change-point scan.

Gate: a baseline of N runs on the default branch and one candidate run, each run the median of K
trials (as the gate reduces trials); the noise history is the baseline itself (N runs) or N older runs more (2N); every trial is 1000 tok/s/GPU x (1 + Normal(0, CV)), and the
candidate is (1 - step) times that. Each simulated comparison goes through the real decision code
(k2bench.harness.analysis.regress.decide) with the default configuration; a "flag" is a verdict of
"regression". False-positive rate = flags with step 0; detection rate = flags with the step.

Change points: a 60-run history with the same noise; the step (if any) starts at run 40. Detection
= a change point within one run of 40; false positive = any change point in a history without a step.

    python bench/regress_bench.py                       # table + results/bench/regress_bench.json
    python bench/regress_bench.py --sims 400 --cp-sims 50 --out /tmp/rb.json   # quicker
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from k2bench.harness.analysis import changepoints
from k2bench.harness.analysis.regress import METRIC_BY_COLUMN, RegressConfig, decide

TPUT = METRIC_BY_COLUMN["tput_per_gpu"]
CVS = (0.01, 0.02, 0.03, 0.04, 0.05)
STEPS = (0.0, 0.03, 0.05, 0.10, 0.20)


def gate_rate(rng, cv: float, step: float, trials: int, n_base: int, n_hist: int, sims: int,
              cfg: RegressConfig) -> float:
    flags = 0
    for _ in range(sims):
        hist_trials = 1000 * (1 + rng.normal(0, cv, (n_hist, trials)))
        base_trials = hist_trials[-n_base:]  # the baseline is the newest n_base runs of the history
        cand_trials = 1000 * (1 - step) * (1 + rng.normal(0, cv, trials))
        # one value per run from its trials, as the gate does (catalogue.TRIAL_AGGREGATION: the median)
        b_runs, h_runs = np.median(base_trials, axis=1), np.median(hist_trials, axis=1)
        v = decide(TPUT, 8, b_runs, np.array([np.median(cand_trials)]), h_runs, base_trials.ravel(), cand_trials,
                   None, None, cfg)
        flags += v.status == "regression"
    return flags / sims


def cp_rate(rng, cv: float, step: float, sims: int, n: int = 60, at: int = 40) -> float:
    hits = 0
    for _ in range(sims):
        x = 1000 * (1 + rng.normal(0, cv, n))
        x[at:] *= 1 - step
        found = [c.index for c in changepoints.detect(x)]
        hits += (any(abs(i - at) <= 1 for i in found) if step else bool(found))
    return hits / sims


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=2000, help="simulated comparisons per gate cell")
    ap.add_argument("--cp-sims", type=int, default=200, help="simulated histories per change-point cell")
    ap.add_argument("--baseline-runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--out", default="results/bench/regress_bench.json")
    args = ap.parse_args()
    cfg = RegressConfig()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    gate = []
    setups = ((1, args.baseline_runs), (3, args.baseline_runs), (1, 2 * args.baseline_runs))
    for trials, n_hist in setups:
        for cv in CVS:
            for step in STEPS:
                rate = gate_rate(rng, cv, step, trials, args.baseline_runs, n_hist, args.sims, cfg)
                gate.append({"trials": trials, "history_runs": n_hist, "cv": cv, "step": step, "flag_rate": rate})
    cps = [{"cv": cv, "step": step, "rate": cp_rate(rng, cv, step, args.cp_sims)} for cv in CVS for step in STEPS]
    elapsed = time.perf_counter() - t0

    print(f"Regression gate: {args.baseline_runs} baseline runs, 1 candidate run, threshold "
          f"{cfg.threshold:.0%}, alpha {cfg.alpha}; {args.sims} comparisons per cell")
    print("share of comparisons flagged as a regression (step 0 = false-positive rate)")
    header = "| trials | history runs | CV | " + " | ".join(f"step {s:.0%}" for s in STEPS) + " |"
    print(header)
    print("|---:|---:|---:|" + "---:|" * len(STEPS))
    for trials, n_hist in setups:
        for cv in CVS:
            cells = [next(g["flag_rate"] for g in gate
                          if (g["trials"], g["history_runs"], g["cv"], g["step"]) == (trials, n_hist, cv, s))
                     for s in STEPS]
            print(f"| {trials} | {n_hist} | {cv:.0%} | " + " | ".join(f"{100 * c:.1f}%" for c in cells) + " |")
    print()
    print(f"Change points (E-divisive, window {changepoints.DEFAULT_WINDOW}, p {changepoints.DEFAULT_PVALUE}): "
          f"60-run histories, step at run 40; {args.cp_sims} histories per cell")
    print("| CV | " + " | ".join(f"step {s:.0%}" for s in STEPS) + " |")
    print("|---:|" + "---:|" * len(STEPS))
    for cv in CVS:
        cells = [next(c["rate"] for c in cps if (c["cv"], c["step"]) == (cv, s)) for s in STEPS]
        print(f"| {cv:.0%} | " + " | ".join(f"{100 * c:.1f}%" for c in cells) + " |")
    print(f"\n(step 0 column: histories with any change point; other columns: change found within 1 run "
          f"of the true one). {elapsed:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": {"threshold": cfg.threshold, "alpha": cfg.alpha,
                                          "min_history": cfg.min_history, "baseline_runs": args.baseline_runs,
                                          "sims": args.sims, "cp_sims": args.cp_sims, "seed": args.seed,
                                          "cp_window": changepoints.DEFAULT_WINDOW,
                                          "cp_pvalue": changepoints.DEFAULT_PVALUE},
                               "gate": gate, "changepoints": cps, "elapsed_s": elapsed}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
