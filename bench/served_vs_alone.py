"""Served against alone: the sweep's per-level figures beside the same one-wave level run in the engine alone.

Inputs: the sweep's run JSON (`k2bench sweep --json`, one wave per level: --num-prompts 1x --warmup 0) and
bench/engine_wave_bench.py's wave_bench.json over the same concurrencies at the server's step budget. Both
ran the same work (C prompts of ISL tokens at once, OSL tokens each), so per concurrency:
- served TPOT p50 - alone TPOT p50 is the time per token spent outside `LLMEngine.step` (the AsyncEngine's
  output queue, detokenisation, SSE framing, the event loop, HTTP, and the client's own reading);
- inside the step, the alone run's full-batch decode step splits into GPU time (CUDA events around the
  launch and copies) and host phases (schedule, prepare, sample's wait and copy, postprocess); step minus
  GPU is the host work the GPU does not hide. That split needs the wave bench's --loop phases, which runs
  one step at a time; with --loop engine (what bench/gpu_serving.sh runs, the server's own loop with async
  scheduling, so that served and alone run the same loop) those columns are empty (nan).
Prints a table and writes served_vs_alone.json.

    python bench/served_vs_alone.py --sweep OUT/serving_sweep.json --wave OUT/wave/wave_bench.json --budget 8192 --out OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PHASES = ("schedule", "prepare", "execute", "sample", "post")


def join(sweep: dict, wave: dict, budget: int) -> list[dict]:
    alone = {r["conc"]: r for r in wave["rows"] if r["budget"] == budget}
    rows = []
    for p in sorted(sweep["points"], key=lambda p: p["concurrency"]):
        a = alone.get(p["concurrency"])
        if a is None:
            continue
        served_tpot = p["tpot_ms"]["median"]
        step, gpu = a["full_decode_step_ms_median"], a["full_decode_gpu_ms_median"]
        rows.append({
            "conc": p["concurrency"], "budget": budget,
            "served_tpot_ms_p50": served_tpot, "alone_tpot_ms_p50": a["tpot_ms_p50"],
            "served_over_alone": served_tpot / a["tpot_ms_p50"] if a["tpot_ms_p50"] else None,
            "outside_step_ms_per_token": served_tpot - a["tpot_ms_p50"],
            "alone_decode_step_ms": step, "alone_decode_gpu_ms": gpu, "host_not_hidden_ms": step - gpu,
            **{f"alone_{ph}_ms": a[f"full_decode_{ph}_ms_median"] for ph in PHASES},
            "served_itl_ms_p99": p["itl_ms"]["p99"], "alone_itl_ms_p99": a.get("itl_ms_p99"),
            "served_ttft_ms_p50": p["ttft_ms"]["median"], "alone_ttft_ms_p50": a["ttft_ms_p50"],
        })
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", required=True, type=Path)
    ap.add_argument("--wave", required=True, type=Path)
    ap.add_argument("--budget", type=int, default=8192, help="the served engine's --max-num-batched-tokens")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    rows = join(json.loads(args.sweep.read_text()), json.loads(args.wave.read_text()), args.budget)
    print(f"{'conc':>5} {'TPOT served':>11} {'alone':>7} {'x':>5} {'outside':>8} {'step':>7} {'GPU':>7} {'host':>6} "
          + " ".join(f"{p:>8}" for p in PHASES) + f" {'ITL99 srv':>9} {'alone':>7} {'TTFT srv':>9} {'alone':>7}")
    for r in rows:
        print(f"{r['conc']:>5} {r['served_tpot_ms_p50']:>11.2f} {r['alone_tpot_ms_p50']:>7.2f} {r['served_over_alone']:>5.2f} "
              f"{r['outside_step_ms_per_token']:>8.2f} {r['alone_decode_step_ms']:>7.2f} {r['alone_decode_gpu_ms']:>7.2f} "
              f"{r['host_not_hidden_ms']:>6.2f} " + " ".join(f"{r[f'alone_{p}_ms']:>8.3f}" for p in PHASES)
              + f" {r['served_itl_ms_p99']:>9.1f} {r['alone_itl_ms_p99'] or float('nan'):>7.1f}"
              f" {r['served_ttft_ms_p50']:>9.0f} {r['alone_ttft_ms_p50']:>7.0f}")
    print("(ms; TPOT/ITL/TTFT per request; step, GPU and phases are the alone run's full-batch decode step medians)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "served_vs_alone.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
