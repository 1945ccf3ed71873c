"""What one big level costs the store: summarise, commit, bytes on disk, read back, export.

A synthetic level shaped like the reference target's heaviest one (concurrency 128:
1,280 measured + 256 warmup requests x 1,024 output tokens, 20 ms gaps with jitter) is
summarised and committed to a fresh SQLite database; then read back as records, as a
requests DataFrame, and exported as k2bench.run/3 JSON with --requests.

    python bench/store_bench.py                      # table + results/bench/store_bench.json
    python bench/store_bench.py --requests 320 --out /tmp/sb.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import tempfile
import time
from pathlib import Path

from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.store import Store


def synthetic_level(n: int, warmup: int, tokens: int, concurrency: int) -> list[RequestRecord]:
    rng = random.Random(0)
    out = []
    for i in range(warmup + n):
        send = 10**12 + i * 50_000_000
        t = send + 200_000_000 + rng.randrange(0, 5_000_000)
        stamps = []
        for _ in range(tokens):
            stamps.append(t)
            t += 20_000_000 + rng.randrange(-500_000, 500_000)
        out.append(RequestRecord(index=i, concurrency=concurrency, warmup=i < warmup, requested_input_tokens=8192,
                                 requested_output_tokens=tokens, send_ns=send, token_ns=stamps,
                                 end_ns=stamps[-1] + 200_000, prompt_tokens=8192, output_tokens=tokens,
                                 success=True))
    return out


def db_bytes(path: Path) -> int:
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path.stat().st_size


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1280, help="measured requests (default 1280)")
    ap.add_argument("--tokens", type=int, default=1024, help="output tokens per request (default 1024)")
    ap.add_argument("--out", default="results/bench/store_bench.json")
    args = ap.parse_args()

    conc = 128
    recs = synthetic_level(args.requests, args.requests // 5, args.tokens, conc)
    stamps = sum(len(r.token_ns) for r in recs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        store = Store.open(f"sqlite:///{path}")
        run_id = store.create_run({"engine": "synthetic", "model": "none", "num_gpus": 4, "tp": 4})
        empty = db_bytes(path)
        point, t_sum = timed(lambda: summarize_level(recs, concurrency=conc, num_gpus=4))
        _, t_add = timed(lambda: store.add_point(run_id, point, recs))
        size = db_bytes(path) - empty
        back, t_load = timed(lambda: store.load_records(run_id, include_warmup=True))
        assert back == recs, "stored stamps differ from the written ones"
        frame, t_frame = timed(lambda: store.requests_frame(run_id))
        doc, t_export = timed(lambda: store.export_run(run_id, include_requests=True))
        json_bytes = len(json.dumps(doc))
        store.close()

    rows = [
        ("requests stored (incl. warmup)", f"{len(recs):,}"),
        ("token stamps stored", f"{stamps:,}"),
        ("summarize_level", f"{t_sum * 1000:,.0f} ms"),
        ("add_point (one transaction)", f"{t_add * 1000:,.0f} ms"),
        ("database growth", f"{size / 1e6:,.2f} MB ({size / stamps:.2f} B/stamp; raw int64 = 8)"),
        ("load_records (decode all)", f"{t_load * 1000:,.0f} ms"),
        ("requests_frame (measured)", f"{t_frame * 1000:,.0f} ms ({len(frame):,} rows)"),
        ("export_run with requests", f"{t_export * 1000:,.0f} ms, JSON {json_bytes / 1e6:,.1f} MB"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    result = {
        "requests": len(recs), "stamps": stamps, "summarize_s": t_sum, "add_point_s": t_add, "db_bytes": size,
        "bytes_per_stamp": size / stamps, "load_records_s": t_load, "requests_frame_s": t_frame,
        "export_s": t_export, "export_json_bytes": json_bytes, "cpu_count": os.cpu_count(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
