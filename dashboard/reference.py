"""Published reference points (results/reference/*.json) for overlaying on measured frontiers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

REFERENCE_ENV = "K2BENCH_REFERENCE_DIR"
COLUMNS = ["name", "source", "engine", "model", "hardware", "workload", "isl", "osl", "concurrency",
           "tput_per_gpu", "interactivity_median"]


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
                         "isl": cfg.get("isl"), "osl": cfg.get("osl"),
                         "concurrency": p.get("concurrency"), "tput_per_gpu": p.get("tput_per_gpu"),
                         "interactivity_median": p.get("interactivity_median")})
    return pd.DataFrame(rows, columns=COLUMNS)


def _num(value) -> str:
    return "?" if value is None or value != value else f"{float(value):g}"


def _model_key(name) -> str:
    return str(name).rstrip("/").rsplit("/", 1)[-1].lower()


def same_model(measured, published) -> bool:
    """A measured model matches a published one by its last path component, ignoring case; a
    suffix after a dash is allowed ('amd/Kimi-K2.5-MXFP4' is Kimi-K2.5), a longer name is not
    ('Kimi-K2.55' is not Kimi-K2.5)."""
    m, p = _model_key(measured), _model_key(published)
    return m == p or m.startswith(p + "-")


def matching(reference: pd.DataFrame, points: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The reference points whose model and workload (ISL/OSL) some measured configuration shares,
    and for each published configuration left out, a sentence saying why.

    A published number is only a yardstick for the same model at the same lengths; drawn next to
    anything else it misleads and stretches the axes far beyond the user's own points."""
    if reference.empty:
        return reference, []
    configs = points[["model", "isl", "osl"]].drop_duplicates().to_dict("records")
    keep, notes = [], []
    for name, grp in reference.groupby("name", sort=False):
        first = grp.iloc[0]
        hit = any(same_model(c["model"], first["model"]) and c["isl"] == first["isl"] and c["osl"] == first["osl"]
                  for c in configs)
        if hit:
            keep.append(grp)
        else:
            notes.append(f"Published reference hidden: {name} is {first['model']} at ISL {_num(first['isl'])} / "
                         f"OSL {_num(first['osl'])}, and no selected configuration runs that model and workload.")
    shown = pd.concat(keep, ignore_index=True) if keep else reference.iloc[0:0]
    return shown, notes
