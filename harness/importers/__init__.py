"""Other tools' result files as k2bench.run/3 documents, so their numbers join the history.

Each importer maps one file to a ``Level``: the run fields it can state and one point. Levels whose
run fields agree (same configuration) become one run, one point per concurrency, and go through the
same validation and store path as ``k2bench import``. A figure a tool does not report is stored as
missing (None), never estimated; where the file has no GPU count, ``--gpus`` must say it, since
every throughput is stored per GPU.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness.record import bounds, runjson

SOURCES = {"vllm": "vLLM `vllm bench serve --save-result` JSON",
           "inferencex": "InferenceX per-configuration result JSON (agg_*.json from utils/process_result.py)",
           "aiperf": "AIPerf profile export (profile_export_aiperf.json)"}


@dataclass
class ImportOptions:
    """What the user adds on the command line to facts the file does not hold."""

    gpus: int | None = None
    engine: str | None = None
    hardware: str | None = None
    commit: str | None = None
    branch: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class Level:
    run: dict  # run fields (without status and id)
    point: dict  # one k2bench point
    source: str  # file it came from
    requests: list[dict] = field(default_factory=list)  # its requests (k2bench.run form), where the file has them


def read_json(path: Path) -> dict:
    """The file as strict JSON (k2bench.harness.record.bounds.parse_json: no NaN, 64-bit integers, not too deep)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    doc = bounds.parse_json(data, str(path))
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a JSON object")
    return doc


def number(doc: dict, key: str, path: Path, *, required: bool = False) -> float | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise UserError(f"{path}: {key} is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{path}: {key} must be a finite number, not {value!r:.80}")
    return float(value)


def count(value, key: str, path: Path) -> int | None:
    """A request or token count: a whole number (AIPerf writes 40.0), never a fraction rounded away."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value != int(value) or value < 0):
        raise UserError(f"{path}: {key} must be a whole number >= 0, not {value!r:.80}")
    return int(value)


def per_gpu(value: float | None, gpus: int) -> float | None:
    return None if value is None else value / gpus


def interactivity(tpot_ms: dict) -> dict:
    """tok/s/user as k2bench defines it: 1000 / TPOT at the median, p90 and p99."""
    return {k: (1000.0 / tpot_ms[k] if tpot_ms.get(k) else None) for k in ("median", "p90", "p99")}


def _module(source: str):
    if source not in SOURCES:
        raise UserError(f"--from {source!r}: known sources are {', '.join(SOURCES)}")
    return importlib.import_module(f"k2bench.harness.importers.{source}")


def to_documents(source: str, paths: list[str | Path], opts: ImportOptions) -> list[dict]:
    """k2bench.run/3 documents (validated) for the files: one run per configuration."""
    module = _module(source)
    levels: list[Level] = [module.read(Path(p), opts) for p in paths]
    groups: dict[str, list[Level]] = {}
    for level in levels:
        key = json.dumps({k: v for k, v in level.run.items() if k not in ("started_at", "extra", "finished_at")},
                         sort_keys=True, default=str)
        groups.setdefault(key, []).append(level)
    docs = []
    for group in groups.values():
        group.sort(key=lambda lv: (lv.point["concurrency"], lv.run["started_at"]))
        run = dict(group[0].run)
        run["started_at"] = min(lv.run["started_at"] for lv in group)
        run["status"] = "complete"
        run["tags"] = {**(run.get("tags") or {}), **opts.tags, "imported_from": source}
        run["extra"] = {**(run.get("extra") or {}), "imported_files": [lv.source for lv in group]}
        trials: dict[int, int] = {}
        points, requests = [], []
        for lv in group:
            conc = lv.point["concurrency"]
            points.append({**lv.point, "trial": trials.get(conc, 0)})
            requests += [{**r, "trial": trials.get(conc, 0)} for r in lv.requests]
            trials[conc] = trials.get(conc, 0) + 1
        run["trials"] = max(trials.values())
        docs.append(runjson.validate_doc(runjson.build_doc(run, points, requests or None)))
    return docs


def base_run(opts: ImportOptions, *, engine: str | None, model: str, num_gpus: int, started_at: str,
             **fields) -> dict:
    run = {"engine": opts.engine or engine or "unknown", "model": model, "num_gpus": num_gpus,
           "hardware": opts.hardware, "commit": opts.commit, "branch": opts.branch, "started_at": started_at}
    run.update({k: v for k, v in fields.items() if v is not None})
    return run


def gpus_or_error(found: int | None, opts: ImportOptions, path: Path) -> int:
    gpus = opts.gpus or found
    if not gpus or gpus < 1:
        raise UserError(f"{path}: the file does not say how many GPUs served it; give --gpus N "
                        "(throughput is stored per GPU)")
    return int(gpus)
