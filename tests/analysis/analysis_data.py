"""Fixture histories (tests/analysis/fixtures) as points_frame-shaped DataFrames, independent of the store."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

FIXTURES = Path(__file__).parent / "fixtures"
LATENCY = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
STATS = ("mean", "median", "std", "p90", "p99", "p99.9")


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def points_rows(doc: dict, run_id: int) -> list[dict]:
    """Flatten a k2bench.run/1 document the way Store.points_frame does (independently of the store)."""
    run = doc["run"]
    rows = []
    for p in doc["points"]:
        row = {"run_id": run_id, **{k: run.get(k) for k in ("commit", "branch", "fingerprint", "engine")},
               "started_at": pd.Timestamp(run["started_at"]), "concurrency": p["concurrency"],
               "trial": p.get("trial", 0), "tput_per_gpu": p["tput_per_gpu"]}
        for k, v in p["interactivity"].items():
            row[f"interactivity_{k}"] = v
        for m in LATENCY:
            for s in STATS:
                row[f"{m}_{s.replace('.', '_')}"] = p[m][s]
        rows.append(row)
    return rows


def frame(docs: list[dict], first_id: int = 1) -> pd.DataFrame:
    return pd.DataFrame([r for i, d in enumerate(docs) for r in points_rows(d, first_id + i)])


def fixture_frames(name: str):
    """(history frame of the main runs, candidate frame, fixture dict); the candidate is the last run."""
    fx = load_fixture(name)
    docs = fx["runs"]
    return frame(docs[:-1]), frame(docs[-1:], first_id=len(docs)), fx
