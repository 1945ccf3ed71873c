"""Runtime speed on the tiny checkpoint (CPU): where a step's time goes, and what the sweep would cost.

Decode steps are timed at the batch sizes and context lengths of the design card's sweep
(`k2bench sweep --isl 8192 --osl 1024 --conc 4..128`). To reach a 9k-token context without
minutes of prefill, the cache is "filled" by bookkeeping alone (the prompt is marked computed;
its cache slots hold zeros), which costs the model the same per decode step. Prefill is timed
for real on one 8192-token prompt with the default chunk budget. From the two, the sweep's
duration is estimated as 12 waves per level (2 x conc warmup + 10 x conc measured requests,
closed loop): each wave prefills conc prompts and decodes 1024 steps at batch conc.

    python bench/engine_runtime_bench.py [--model DIR] [--quick] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from k2bench.engine.runtime.build import EngineOptions, build_engine
from k2bench.engine.runtime.runtime_config import RuntimeConfig
from k2bench.engine.runtime.sequence import SamplingParams, Sequence

ISL, OSL = 8192, 1024
CONCS = (4, 8, 16, 32, 64, 128)


def decode_profile(model: str, batch: int, ctx: int, steps: int) -> dict:
    rt = RuntimeConfig(max_num_seqs=batch, max_num_batched_tokens=batch * ctx + 1, max_model_len=ctx + steps + 8)
    eng = build_engine(EngineOptions(model=model, device="cpu", runtime=rt))
    sch, run = eng.scheduler, eng.runner
    g = torch.Generator().manual_seed(0)
    for _ in range(batch):
        sch.add(Sequence(torch.randint(10, 400, (ctx,), generator=g).tolist(),
                         SamplingParams(temperature=1.0, max_tokens=steps + 4, ignore_eos=True)))
    out = sch.schedule()  # admits all and schedules their whole prompts: mark them computed, no model
    sch.postprocess(out, [1] * batch)
    t = dict(schedule=0.0, prepare=0.0, model=0.0, sample=0.0, post=0.0)
    for _ in range(steps):
        t0 = time.perf_counter()
        so = sch.schedule()
        t1 = time.perf_counter()
        inp = run.prepare(so)
        t2 = time.perf_counter()
        logits = run.execute(inp)
        t3 = time.perf_counter()
        toks = run.sample(logits, so)
        t4 = time.perf_counter()
        sch.postprocess(so, toks)
        t5 = time.perf_counter()
        for k, dt in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            t[k] += dt
    ms = {k: round(v / steps * 1000, 2) for k, v in t.items()}
    step = sum(ms.values())
    return {"batch": batch, "ctx": ctx, "steps": steps, "ms_per_step": round(step, 2), **{f"{k}_ms": v for k, v in ms.items()},
            "runtime_share": round((step - ms["model"]) / step, 4), "tok_s": round(batch / step * 1000, 1)}


def prefill_rate(model: str, isl: int) -> dict:
    rt = RuntimeConfig(max_model_len=isl + 8)
    eng = build_engine(EngineOptions(model=model, device="cpu", runtime=rt))
    g = torch.Generator().manual_seed(1)
    s = Sequence(torch.randint(10, 400, (isl,), generator=g).tolist(), SamplingParams(max_tokens=1, ignore_eos=True))
    t0 = time.perf_counter()
    eng.generate([s])
    dt = time.perf_counter() - t0
    return {"isl": isl, "chunk": rt.max_num_batched_tokens, "seconds": round(dt, 2), "tok_s": round(isl / dt)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: a fresh tiny MXFP4 one)")
    ap.add_argument("--quick", action="store_true", help="fewer, smaller points")
    ap.add_argument("--out", default="bench/results/engine_runtime_bench.json")
    args = ap.parse_args()
    tmp = None
    model = args.model
    if model is None:
        from k2bench.engine.model.tiny import write_tiny_checkpoint

        tmp = tempfile.TemporaryDirectory()
        model = str(write_tiny_checkpoint(Path(tmp.name) / "tiny", quant="mxfp4"))
    load = os.getloadavg()[0]
    ctx = ISL + OSL // 2  # the average context of a decode step in the sweep
    points = [(4, 1024)] + [(c, ctx) for c in CONCS] if not args.quick else [(4, 1024), (16, 2048)]
    steps = 3
    rows = [decode_profile(model, b, c, steps) for b, c in points]
    pre = prefill_rate(model, ISL if not args.quick else 2048)
    print(f"threads {torch.get_num_threads()}, load average {load:.1f} at start\n")
    print(f"{'batch':>5} {'ctx':>6} {'ms/step':>8} {'model':>8} {'prepare':>8} {'sample':>7} {'sched+post':>10} "
          f"{'runtime %':>9} {'tok/s':>7}")
    for r in rows:
        print(f"{r['batch']:>5} {r['ctx']:>6} {r['ms_per_step']:>8} {r['model_ms']:>8} {r['prepare_ms']:>8} "
              f"{r['sample_ms']:>7} {r['schedule_ms'] + r['post_ms']:>10.2f} {r['runtime_share'] * 100:>8.1f}% "
              f"{r['tok_s']:>7}")
    print(f"\nprefill: {pre['isl']} tokens in chunks of {pre['chunk']}: {pre['seconds']} s ({pre['tok_s']} tok/s)")
    estimate = []
    if not args.quick:
        step_at = {r["batch"]: r["ms_per_step"] / 1000 for r in rows if r["ctx"] > ISL}
        total = 0.0
        print(f"\n{'conc':>5} {'est. level (s)':>15}   (12 waves x (conc x prefill + {OSL} decode steps))")
        for conc in CONCS:
            level = 12 * (conc * ISL / pre["tok_s"] + OSL * step_at[conc])
            total += level
            estimate.append({"conc": conc, "seconds": round(level)})
            print(f"{conc:>5} {level:>15.0f}")
        print(f"{'total':>5} {total:>15.0f}  = {total / 3600:.1f} h")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"load_average": load, "threads": torch.get_num_threads(),
                                          "decode": rows, "prefill": pre, "sweep_estimate": estimate}, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
