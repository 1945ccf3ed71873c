"""The server-side split of a sweep's levels from its k2bench.run JSON, with the checks a reader wants
before trusting it: every phase histogram holds exactly the measured requests, inference = prefill +
decode (means), and the client's TTFT exceeds the server's (queue + prefill) by a small gap.

    python bench/server_split_table.py sweep.json [--out split.json]

Prints a table and writes the figures and checks as JSON. Runs anywhere (it only reads the file);
bench/gpu_server_split.sh runs it after a bundled-engine sweep on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys

PHASES = ("queue", "prefill", "decode", "inference")


def level_row(p: dict) -> dict:
    split = ((p.get("server_metrics") or {}).get("split")) or {}
    counts = {ph: (split.get(ph) or {}).get("count") for ph in PHASES}
    means = {ph: (p.get(f"server_{ph}_ms") or {}).get("mean") for ph in PHASES}
    client = (p.get("ttft_ms") or {}).get("mean")
    server = p.get("server_ttft_ms")
    return {
        "concurrency": p["concurrency"], "trial": p.get("trial", 0), "measured": p.get("completed"),
        "client_ttft_ms": client, "server_ttft_ms": server,
        "gap_ms": None if client is None or server is None else client - server,
        **{f"{ph}_mean_ms": means[ph] for ph in PHASES},
        **{f"{ph}_p99_ms": (p.get(f"server_{ph}_ms") or {}).get("p99") for ph in PHASES},
        "p99_buckets_ms": {ph: (split.get(ph) or {}).get("p99_bucket_ms") for ph in PHASES},
        "spec_accept_len": p.get("spec_accept_len"), "spec_accept_rate": p.get("spec_accept_rate"),
        "checks": {
            "counts_equal_measured": all(c == p.get("completed") for c in counts.values()),
            "inference_is_prefill_plus_decode": None if None in (means["inference"], means["prefill"], means["decode"])
            else abs(means["inference"] - means["prefill"] - means["decode"]) <= 1e-3 * max(means["inference"], 1e-9),
            "client_ttft_above_server": None if client is None or server is None else client > server,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_json")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    doc = json.load(open(args.run_json))
    rows = [level_row(p) for p in doc["points"]]

    def f(v, w=9, d=1):
        return f"{'-':>{w}}" if v is None else f"{v:>{w}.{d}f}"

    print(f"{'conc':>5} {'client TTFT':>11} {'server TTFT':>11} {'gap':>7} {'queue':>9} {'prefill':>9} {'decode':>9} "
          f"{'inference':>9} {'prefill p99':>11} {'accept':>7}  checks (ms, means unless p99)")
    for r in rows:
        bad = [k for k, v in r["checks"].items() if v is False]
        print(f"{r['concurrency']:>5} {f(r['client_ttft_ms'], 11)} {f(r['server_ttft_ms'], 11)} {f(r['gap_ms'], 7, 2)} "
              f"{f(r['queue_mean_ms'])} {f(r['prefill_mean_ms'])} {f(r['decode_mean_ms'])} {f(r['inference_mean_ms'])} "
              f"{f(r['prefill_p99_ms'], 11)} {f(r['spec_accept_len'], 7, 2)}  {'ok' if not bad else 'FAILED: ' + ', '.join(bad)}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"source": args.run_json, "hardware": doc["run"].get("hardware"), "levels": rows}, fh, indent=2)
    return 0 if all(v is not False for r in rows for v in r["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
