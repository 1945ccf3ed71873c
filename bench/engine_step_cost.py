"""The host's share of a decode step on a GPU: the engine's step time against the CUDA-graph replay inside it.

Builds the engine as `k2bench serve` does (triton backend, decode CUDA graphs) on a checkpoint, fills B
sequences' caches by bookkeeping alone (their prompts are marked computed; the slots hold zeros, which costs
a decode step the same), then runs `LLMEngine.step` and splits each step: schedule, prepare (host tensors),
execute (copies into the graph's buffers and the replay launch), sample (argmax, whose `.tolist()` waits for
the GPU), postprocess. CUDA events around execute give the GPU time of the copies and the replay; step time
minus that is what the host adds that the graph does not hide. Medians over the steps; writes JSON.

    python bench/engine_step_cost.py --model /tmp/k2-width-2 --batches 4,32,128 --ctx 8192 --out /tmp/out
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from k2bench.engine.runtime.build import EngineOptions, build_engine
from k2bench.engine.runtime.runtime_config import RuntimeConfig
from k2bench.engine.runtime.sequence import SamplingParams, Sequence

PHASES = ("schedule", "prepare", "execute", "sample", "post")


def step_cost(model: str, batch: int, ctx: int, steps: int, block_size: int) -> dict:
    rt = RuntimeConfig(max_num_seqs=batch, max_num_batched_tokens=batch * ctx + 1, max_model_len=ctx + steps + 16,
                       block_size=block_size, num_kv_blocks=batch * (-(-(ctx + steps + 16) // block_size)) + 8)
    eng = build_engine(EngineOptions(model=model, device="cuda", backend="triton", runtime=rt))
    sch, run = eng.scheduler, eng.runner
    g = torch.Generator().manual_seed(0)
    for _ in range(batch):
        sch.add(Sequence(torch.randint(10, 400, (ctx,), generator=g).tolist(),
                         SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)))
    out = sch.schedule()  # admits all with their whole prompts: mark them computed without the model
    sch.postprocess(out, [1] * batch)
    per = {k: [] for k in (*PHASES, "step", "gpu")}
    for i in range(steps + 3):
        t = [time.perf_counter()]
        so = sch.schedule()
        t.append(time.perf_counter())
        inp = run.prepare(so)
        t.append(time.perf_counter())
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        logits = run.execute(inp)
        b.record()
        t.append(time.perf_counter())
        toks = run.sample(logits, so)
        t.append(time.perf_counter())
        sch.postprocess(so, toks)
        t.append(time.perf_counter())
        if i < 3:  # warm-up
            continue
        for k, (t0, t1) in zip(PHASES, zip(t[:-1], t[1:], strict=True), strict=True):
            per[k].append((t1 - t0) * 1e3)
        per["step"].append((t[-1] - t[0]) * 1e3)
        per["gpu"].append(a.elapsed_time(b))
    replays = run.graphs.replays if run.graphs is not None else 0
    eng.shutdown()
    med = {k: statistics.median(v) for k, v in per.items()}
    return {"batch": batch, "ctx": ctx, "steps": steps, "graph_replays": replays,
            **{f"{k}_ms": round(v, 4) for k, v in med.items()},
            "host_overhead_ms": round(med["step"] - med["gpu"], 4),
            "host_share": round((med["step"] - med["gpu"]) / med["step"], 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="4,32,128")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--block-size", type=int, default=RuntimeConfig.block_size)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        row = step_cost(args.model, batch, args.ctx, args.steps, args.block_size)
        rows.append(row)
        print(f"B={batch:>4} step {row['step_ms']:7.3f} ms  gpu (copies + replay) {row['gpu_ms']:7.3f} ms  host adds "
              f"{row['host_overhead_ms']:6.3f} ms ({100 * row['host_share']:.0f}%)  schedule {row['schedule_ms']:.3f}"
              f"  prepare {row['prepare_ms']:.3f}  execute {row['execute_ms']:.3f}  sample {row['sample_ms']:.3f}"
              f"  post {row['post_ms']:.3f}  replays {row['graph_replays']}", flush=True)
        torch.cuda.empty_cache()
    doc = {"model": args.model, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    (args.out / "step_cost.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
