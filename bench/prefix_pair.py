"""The frontier pair of a shared-prefix workload, prefix caching off vs on: one table row per level with
tok/s/GPU, tok/s/user, TTFT p50 and the measured hit rate of each run, and the TTFT ratio; JSON out.

    python bench/prefix_pair.py --off off.json --on on.json --out pair.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _levels(path: str) -> dict[int, dict]:
    doc = json.loads(Path(path).read_text())
    return {p["concurrency"]: p for p in doc["points"] if p.get("valid", True)}


def pair(off: dict[int, dict], on: dict[int, dict]) -> list[dict]:
    rows = []
    for conc in sorted(set(off) | set(on)):
        a, b = off.get(conc, {}), on.get(conc, {})
        ttft_a = (a.get("ttft_ms") or {}).get("median")
        ttft_b = (b.get("ttft_ms") or {}).get("median")
        rows.append({"concurrency": conc,
                     "off": {"tput_per_gpu": a.get("tput_per_gpu"), "tok_s_user": (a.get("interactivity") or {}).get(
                         "median"), "ttft_p50_ms": ttft_a, "hit_rate": a.get("prefix_hit_rate")},
                     "on": {"tput_per_gpu": b.get("tput_per_gpu"), "tok_s_user": (b.get("interactivity") or {}).get(
                         "median"), "ttft_p50_ms": ttft_b, "hit_rate": b.get("prefix_hit_rate")},
                     "ttft_on_over_off": ttft_b / ttft_a if ttft_a and ttft_b else None})
    return rows


def _f(v, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--off", required=True, help="k2bench.run JSON of the sweep with caching off")
    ap.add_argument("--on", required=True, help="k2bench.run JSON of the sweep with caching on")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = pair(_levels(args.off), _levels(args.on))
    print(f"{'conc':>5} | {'tok/s/GPU off':>13} {'on':>9} | {'tok/s/user off':>14} {'on':>7} | "
          f"{'TTFT p50 off':>12} {'on':>8} {'on/off':>6} | {'hit off':>7} {'on':>6}")
    for r in rows:
        a, b = r["off"], r["on"]
        print(f"{r['concurrency']:>5} | {_f(a['tput_per_gpu']):>13} {_f(b['tput_per_gpu']):>9} | "
              f"{_f(a['tok_s_user']):>14} {_f(b['tok_s_user']):>7} | {_f(a['ttft_p50_ms']):>12} "
              f"{_f(b['ttft_p50_ms']):>8} {_f(r['ttft_on_over_off'], '.2f'):>6} | {_f(a['hit_rate'], '.3f'):>7} "
              f"{_f(b['hit_rate'], '.3f'):>6}")
    Path(args.out).write_text(json.dumps({"off": args.off, "on": args.on, "levels": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
