"""Helpers shared by the store tests (also run inside child processes, so no pytest imports)."""

from __future__ import annotations

from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.metrics import summarize_level

MS = 1_000_000


def make_level(concurrency: int, n: int | None = None, tokens: int = 8, warmup: int = 0, seed: int = 0,
               fail_every: int = 0) -> list[RequestRecord]:
    """Synthetic records with deterministic, slightly uneven stamps."""
    n = n if n is not None else 2 * concurrency
    out = []
    for i in range(warmup + n):
        send = 10**12 + seed * 10**9 + i * 3 * MS
        ok = not (fail_every and i % fail_every == fail_every - 1)
        stamps = [send + 50 * MS + j * 5 * MS + ((i * 31 + j * 17 + seed) % 97) * 1000 for j in range(tokens)] if ok else []
        out.append(RequestRecord(
            index=i, concurrency=concurrency, warmup=i < warmup, requested_input_tokens=64,
            requested_output_tokens=tokens, send_ns=send, token_ns=stamps,
            end_ns=(stamps[-1] if stamps else send + 2 * MS) + 300_000,
            prompt_tokens=64 if ok else None, output_tokens=tokens if ok else None,
            success=ok, error=None if ok else f"HTTP 500 on request {i}",
        ))
    return out


def run_meta(**over) -> dict:
    meta = {
        "commit": "abc1234def", "branch": "main", "engine": "bundled", "engine_version": "0.1.0",
        "engine_flags": {"max_num_seqs": 64}, "server_command": "k2bench serve --model tiny --tp 2",
        "model": "tiny-k2", "precision": "mxfp4", "hardware": "cpu", "num_gpus": 2, "tp": 2,
        "workload": "1k1k", "isl": 64, "osl": 8, "range_ratio": 1.0, "tags": {"ci": "yes"}, "trials": 1,
    }
    meta.update(over)
    return meta


def write_levels(url: str, concurrencies: list[int], seed: int = 0, finish: str | None = "complete",
                 meta: dict | None = None, ready: str | None = None, go: str | None = None) -> int:
    """One run with a level per concurrency (records stored); used in-process and by child processes.

    ready/go: file paths for a start barrier (touch ready, then wait until go exists), so that
    several writer processes really write at the same time."""
    import time
    from pathlib import Path

    from k2bench.harness.store import Store

    with Store.open(url) as store:
        if ready and go:
            Path(ready).touch()
            deadline = time.monotonic() + 120
            while not Path(go).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        run_id = store.create_run(meta or run_meta())
        for c in concurrencies:
            recs = make_level(c, seed=seed, warmup=2)
            store.add_point(run_id, summarize_level(recs, concurrency=c, num_gpus=2), recs)
        if finish:
            store.finish_run(run_id, finish)
        return run_id
