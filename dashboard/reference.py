"""Published reference points (results/reference/*.json) for overlaying on measured frontiers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

REFERENCE_ENV = "K2BENCH_REFERENCE_DIR"
COLUMNS = ["name", "source", "engine", "model", "hardware", "workload", "concurrency", "tput_per_gpu",
           "interactivity_median"]


def reference_dir() -> Path:
    """results/reference of the checkout this package runs from, unless the env var says otherwise."""
    if os.environ.get(REFERENCE_ENV):
        return Path(os.environ[REFERENCE_ENV])
    return Path(__file__).resolve().parents[1] / "results" / "reference"


def load_reference(directory: Path | None = None) -> pd.DataFrame:
    """One row per published point; empty when the folder or its files are absent."""
    directory = directory or reference_dir()
    rows = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        doc = json.loads(path.read_text())
        if doc.get("schema") != "k2bench.reference/1":
            continue
        cfg = doc.get("configuration", {})
        src = doc.get("source", {})
        source = f"{src.get('publisher', '')}: \"{src.get('title', path.name)}\"".strip(": ")
        for p in doc.get("points", []):
            rows.append({"name": doc.get("name", path.stem), "source": source,
                         "engine": cfg.get("engine"), "model": cfg.get("model"),
                         "hardware": cfg.get("hardware"), "workload": cfg.get("workload"),
                         "concurrency": p.get("concurrency"), "tput_per_gpu": p.get("tput_per_gpu"),
                         "interactivity_median": p.get("interactivity_median")})
    return pd.DataFrame(rows, columns=COLUMNS)
