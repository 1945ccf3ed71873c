"""Decode step time of each sweep level against the memory roofline of the bundled engine.

A decode step must read, on each rank, every weight it uses once (the replicated ones whole, the
tensor-parallel ones as this rank's slice; routed experts only if some token of the batch picked
them) and the latent KV cache of every running sequence. bytes / measured bandwidth is the floor
of that step's time; the sweep's median TPOT is the step time a user saw (it includes prefill
chunks that share steps, so it is an upper bound on the pure decode step).

A one-wave level (as many prompts as streams, all sent at once: the design card's) also pays for the
prompts prefilled while it decodes. With t_p the time one prompt took to prefill, read from the level
itself (TTFT p50 = (N + 1) / 2 x t_p when prompts are prefilled one after another), the median request
has (N - 1) / 2 prefill steps among its OSL - 1 gaps (`stall ms`: their share of its TPOT). `bound ms`
is the least TPOT p50 that prefill speed allows with decode steps at their floor, and `decode ms` the
decode step the level implies (k2bench.harness.telemetry.roofline.one_wave_stall has the model;
docs/engine.md, "what a one-wave level can reach"). Levels with more prompts than streams get none.

Byte counts come from the checkpoint's own tensors (safetensors headers; nothing is loaded), so the
same script serves the tiny model and the full-width one. The byte model lives in
k2bench.harness.telemetry.roofline, which also gives the sweep its roofline curve.

    python bench/decode_roofline.py --model DIR --tp 4 --run run.json --bandwidth-gbs 4300 [--out roofline.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from k2bench.harness.telemetry.roofline import (
    one_wave_bound_ms,
    one_wave_decode_ms,
    one_wave_stall,
    step_bytes,
    tensor_bytes,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--run", required=True, type=Path, help="k2bench.run JSON of the sweep (k2bench export --json)")
    ap.add_argument("--bandwidth-gbs", type=float, required=True, help="measured device memory bandwidth, GB/s")
    ap.add_argument("--kv-bytes", type=int, default=2, help="bytes per cached value (2 = bf16, 1 = fp8)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    cfg = json.loads((args.model / "config.json").read_text())
    sizes = tensor_bytes(args.model)
    doc = json.loads(args.run.read_text())
    isl, osl = doc["run"]["isl"], doc["run"]["osl"]
    rows = []
    for p in sorted(doc["points"], key=lambda p: p["concurrency"]):
        b = step_bytes(sizes, cfg, args.tp, p["concurrency"], isl + osl / 2, args.kv_bytes)
        floor_ms = b["total"] / (args.bandwidth_gbs * 1e9) * 1e3
        tpot = p["tpot_ms"]["median"]
        wave = one_wave_stall(p, osl)
        rows.append({
            "concurrency": p["concurrency"], "completed": p["completed"], "tput_per_gpu": p["tput_per_gpu"],
            "tok_s_user": p["interactivity"]["median"], "tpot_ms_median": tpot,
            "bytes_per_step_GB": b["total"] / 1e9, "weights_GB": (b["weights_fixed"] + b["experts"]) / 1e9,
            "kv_GB": b["kv"] / 1e9, "experts_touched": b["experts_touched"],
            "roofline_ms": floor_ms, "x_roofline": tpot / floor_ms if floor_ms else None,
            "achieved_GBs": b["total"] / (tpot / 1e3) / 1e9 if tpot else None,
            **wave, "bound_ms": one_wave_bound_ms(floor_ms, wave) if wave else None,
            "x_bound": tpot / one_wave_bound_ms(floor_ms, wave) if wave and tpot else None,
            "decode_ms": one_wave_decode_ms(tpot, wave) if wave and tpot else None,
            "decode_x_floor": one_wave_decode_ms(tpot, wave) / floor_ms if wave and tpot and floor_ms else None,
        })
    head = (f"{'conc':>5} {'done':>5} {'tok/s/GPU':>10} {'tok/s/user':>10} {'TPOT ms':>9} {'GB/step':>8} "
            f"{'experts':>8} {'floor ms':>9} {'x floor':>8} {'GB/s':>8} {'t_p ms':>7} {'stall ms':>9} "
            f"{'bound ms':>9} {'x bound':>8} {'decode ms':>10} {'x floor':>8}")
    print(head)

    def opt(v, width: int, fmt: str) -> str:
        return f"{v:>{width}{fmt}}" if v is not None else f"{'-':>{width}}"

    for r in rows:
        print(f"{r['concurrency']:>5} {r['completed']:>5} {r['tput_per_gpu']:>10.1f} {r['tok_s_user']:>10.2f} "
              f"{r['tpot_ms_median']:>9.2f} {r['bytes_per_step_GB']:>8.3f} {r['experts_touched']:>8.1f} "
              f"{r['roofline_ms']:>9.3f} {r['x_roofline']:>8.2f} {r['achieved_GBs']:>8.1f} "
              f"{opt(r.get('prompt_ms'), 7, '.1f')} {opt(r.get('stall_ms'), 9, '.2f')} {opt(r['bound_ms'], 9, '.2f')} "
              f"{opt(r['x_bound'], 8, '.2f')} {opt(r['decode_ms'], 10, '.2f')} {opt(r['decode_x_floor'], 8, '.2f')}")
    if args.out:
        args.out.write_text(json.dumps({"bandwidth_gbs": args.bandwidth_gbs, "tp": args.tp, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
