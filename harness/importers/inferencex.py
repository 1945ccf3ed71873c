"""InferenceX's per-configuration result JSON (``agg_<name>.json``, written by utils/process_result.py).

InferenceX keeps the configuration (``hw``, ``framework``, ``precision``, ``model``, ``tp``, ``ep``,
``dp_attention``, ``isl``, ``osl``, ``conc``) and figures derived from vLLM's benchmark:
``tput_per_gpu``, ``output_tput_per_gpu``, ``input_tput_per_gpu`` (tok/s/GPU) and, for every
``X_ms`` key of the vLLM result, ``X`` in seconds (``median_ttft``, ``p99_tpot``, ...). The GPU count
is tp single-node, prefill + decode GPUs multi-node. The file holds no request counts, token
totals or duration: those stay missing.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness.importers import (
    ImportOptions,
    Level,
    base_run,
    gpus_or_error,
    interactivity,
    number,
    read_json,
    vllm,
)

# InferenceX keeps vLLM's key names (in seconds, without the _ms suffix): the same tables.
STATS, METRICS = vllm.STATS, vllm.METRICS


def _gpus(doc: dict) -> int | None:
    if doc.get("is_multinode"):
        pre, dec = doc.get("num_prefill_gpu"), doc.get("num_decode_gpu")
        return pre + dec if isinstance(pre, int) and isinstance(dec, int) else None
    tp = doc.get("tp")
    return tp if isinstance(tp, int) and not isinstance(tp, bool) else None


def read(path: Path, opts: ImportOptions) -> Level:
    doc = read_json(path)
    if "tput_per_gpu" not in doc or "conc" not in doc:
        raise UserError(f"{path}: not an InferenceX result (no conc/tput_per_gpu)")
    conc = doc["conc"]
    if not isinstance(conc, int) or isinstance(conc, bool) or conc < 1:
        raise UserError(f"{path}: conc is {conc!r}")
    gpus = gpus_or_error(_gpus(doc), opts, path)
    latency = {}
    for metric, key in METRICS.items():
        latency[metric] = {}
        for stat, prefix in STATS.items():
            seconds = number(doc, f"{prefix}_{key}", path)
            latency[metric][stat] = None if seconds is None else seconds * 1000.0
    point = {
        "concurrency": conc, "num_prompts": None, "completed": None, "failed": None,
        "tput_per_gpu": number(doc, "tput_per_gpu", path, required=True),
        "output_tput_per_gpu": number(doc, "output_tput_per_gpu", path),
        "input_tput_per_gpu": number(doc, "input_tput_per_gpu", path),
        "interactivity": interactivity(latency["tpot_ms"]), **latency,
    }
    extra = {"started_at_from": "file modification time"}
    extra.update({k: doc[k] for k in ("ep", "dp_attention", "spec_decoding", "disagg", "is_multinode", "image",
                                 "infmax_model_prefix", "mtp") if k in doc})
    run = base_run(opts, engine=str(doc.get("framework") or "") or None, model=str(doc.get("model") or "unknown"),
                   num_gpus=gpus, started_at=_written_at(path), tp=doc.get("tp") if not doc.get("is_multinode") else None,
                   precision=doc.get("precision"), isl=doc.get("isl"), osl=doc.get("osl"),
                   extra=extra)
    if run.get("hardware") is None and doc.get("hw"):
        run["hardware"] = str(doc["hw"])
    return Level(run=run, point=point, source=str(path))


def _written_at(path: Path) -> str:
    """The file holds no date (InferenceX keeps it with the workflow run), so the run is dated by when the
    file was written; ``extra.started_at_from`` says so."""
    return datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc).isoformat()
