"""The engine thread's own host time per decode step (scheduling, inputs, sampling hand-off, post-processing),
with the device stubbed out: no server, no model run. It is what async scheduling hides behind the device and,
with many streams, what the engine thread takes of the GIL it shares with the server's event loop.

    python bench/engine_host_step.py --model TINY_CKPT --conc 4,32,128 --steps 500 --out DIR

Prints a table and writes DIR/engine_host_step.json (median of --reps runs of --steps steps each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def measure(model: str, conc: int, steps: int, overlap: bool) -> float:
    """Mean host seconds per `LLMEngine.step` with `conc` sequences decoding."""
    import torch

    from k2bench.engine.runtime.build import EngineOptions, build_engine
    from k2bench.engine.runtime.runner import SampledTokens
    from k2bench.engine.runtime.runtime_config import RuntimeConfig
    from k2bench.engine.runtime.sequence import SamplingParams, Sequence

    max_len = 256 + steps + 64
    rt = RuntimeConfig(max_num_seqs=conc, max_model_len=max_len, num_kv_blocks=conc * max_len // 32 + 8,
                       async_scheduling=overlap)
    eng = build_engine(EngineOptions(model=model, device="cpu", backend="torch", runtime=rt))
    run = eng.runner
    run.execute = lambda inp: None  # the launch returns at once

    def sample_launch(logits, sched):  # tokens known at once: no device
        t = torch.full((sum(1 for s in sched.seqs if s.samples),), 100, dtype=torch.int64)
        return SampledTokens(t, t)

    run.sample_launch = sample_launch
    for _ in range(conc):
        eng.add(Sequence(list(range(5, 5 + 200)), SamplingParams(temperature=0, max_tokens=steps + 40,
                                                                 ignore_eos=True)))
    for _ in range(20):  # the prefill and the first decodes
        eng.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    return (time.perf_counter() - t0) / steps


def measure_fresh(model: str, conc: int, steps: int, overlap: bool) -> float:
    """`measure` in a process of its own: engines built earlier in the same process slow the later ones."""
    out = subprocess.run([sys.executable, __file__, "--one", f"{conc},{steps},{int(overlap)}", "--model", model,
                          "--out", "-"], check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a checkpoint that sizes the runtime (the tiny one will do)")
    ap.add_argument("--conc", default="4,32,128")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # CONC,STEPS,OVERLAP: one measurement, printed (internal)
    args = ap.parse_args()
    if args.one:
        conc, steps, overlap = (int(x) for x in args.one.split(","))
        print(measure(args.model, conc, steps, bool(overlap)))
        return 0
    if args.steps < 1 or args.reps < 1:
        ap.error("--steps and --reps must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'conc':>5} {'async':>6} {'host us/step':>13} {'us/seq':>7}")
    for conc in (int(c) for c in args.conc.split(",")):
        for overlap in (True, False):
            us = statistics.median(measure_fresh(args.model, conc, args.steps, overlap)
                                   for _ in range(args.reps)) * 1e6
            rows.append({"conc": conc, "async_scheduling": overlap, "host_us_per_step": round(us, 1),
                         "host_us_per_seq": round(us / conc, 2)})
            print(f"{conc:5d} {'on' if overlap else 'off':>6} {us:13.1f} {us / conc:7.2f}", flush=True)
    doc = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "steps": args.steps, "reps": args.reps,
           "load_average": os.getloadavg()[0], "rows": rows}
    (args.out / "engine_host_step.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
