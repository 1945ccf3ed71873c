"""AIPerf's aggregated profile export (``profile_export_aiperf.json``): one concurrency level per file.

Each metric is an object ``{"unit", "avg", "p1" ... "p99", "min", "max", "std"}`` (AIPerf's
JsonMetricResult), metrics with no value left out. AIPerf's names differ from k2bench's:
``inter_token_latency`` is per-request (latency - TTFT) / (tokens - 1), k2bench's TPOT;
``inter_chunk_latency`` is the gap between streamed chunks, k2bench's ITL; ``request_latency`` is
E2EL. ``request_count`` counts successful requests and ``error_request_count`` (absent when none
failed) the failed ones. The concurrency and model come from ``input_config``. AIPerf reports no
p99.9, so it stays missing.
"""

from __future__ import annotations

from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness.importers import (
    ImportOptions,
    Level,
    base_run,
    count,
    gpus_or_error,
    interactivity,
    per_gpu,
    read_json,
)

STATS = {"mean": "avg", "median": "p50", "std": "std", "p90": "p90", "p99": "p99"}
METRICS = {"ttft_ms": "time_to_first_token", "tpot_ms": "inter_token_latency", "itl_ms": "inter_chunk_latency",
           "e2el_ms": "request_latency"}
TO_MS = {"ms": 1.0, "s": 1000.0, "sec": 1000.0, "us": 1e-3, "ns": 1e-6}


def _metric(doc: dict, name: str, path: Path) -> dict | None:
    m = doc.get(name)
    if m is None:
        return None
    if not isinstance(m, dict) or "unit" not in m:
        raise UserError(f"{path}: {name} is not an AIPerf metric object (no unit)")
    return m


def _stat(m: dict | None, key: str, path: Path, name: str, scale: float = 1.0) -> float | None:
    if m is None or m.get(key) is None:
        return None
    v = m[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UserError(f"{path}: {name}.{key} must be a number")
    return float(v) * scale


def _latency(doc: dict, name: str, path: Path) -> dict:
    m = _metric(doc, name, path)
    out = {"p99.9": None}
    scale = 1.0
    if m is not None:
        unit = str(m["unit"]).lower()
        if unit not in TO_MS:
            raise UserError(f"{path}: {name} has unit {m['unit']!r}; expected one of {', '.join(TO_MS)}")
        scale = TO_MS[unit]
    for stat, key in STATS.items():
        out[stat] = _stat(m, key, path, name, scale)
    return out


def _config(doc: dict, path: Path) -> tuple[int, str, int | None, int | None]:
    cfg = doc.get("input_config")
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: no input_config, so the concurrency is unknown")
    conc = _section(cfg, "loadgen", path).get("concurrency")
    if not isinstance(conc, int) or isinstance(conc, bool) or conc < 1:
        raise UserError(f"{path}: input_config.loadgen.concurrency is {conc!r}; k2bench stores closed-loop levels")
    names = _section(cfg, "endpoint", path).get("model_names") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UserError(f"{path}: input_config.endpoint.model_names is not a list of names")
    prompt = _section(_section(cfg, "input", path), "prompt", path)
    isl = _section(prompt, "input_tokens", path).get("mean")
    osl = _section(prompt, "output_tokens", path).get("mean")
    return conc, names[0] if names else "unknown", isl, osl


def _section(obj: dict, key: str, path: Path) -> dict:
    """A nested object of the export ({} when absent); anything else is not AIPerf's format."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{path}: input_config ... {key} is not an object")
    return value


def read(path: Path, opts: ImportOptions) -> Level:
    doc = read_json(path)
    if "request_count" not in doc:
        raise UserError(f"{path}: not an AIPerf profile export (no request_count)")
    conc, model, isl, osl = _config(doc, path)
    gpus = gpus_or_error(None, opts, path)
    completed = count(_stat(_metric(doc, "request_count", path), "avg", path, "request_count"),
                      "request_count.avg", path) or 0
    failed = count(_stat(_metric(doc, "error_request_count", path), "avg", path, "error_request_count"),
                   "error_request_count.avg", path) or 0
    dur = _metric(doc, "benchmark_duration", path)
    if dur is not None and str(dur["unit"]).lower() not in ("sec", "s"):
        raise UserError(f"{path}: benchmark_duration has unit {dur['unit']!r}; expected sec")
    duration = _stat(dur, "avg", path, "benchmark_duration")
    total_in = count(_stat(_metric(doc, "total_isl", path), "avg", path, "total_isl"), "total_isl.avg", path)
    total_out = count(_stat(_metric(doc, "total_output_tokens", path), "avg", path, "total_output_tokens"),
                      "total_output_tokens.avg", path)
    out_rate = _stat(_metric(doc, "output_token_throughput", path), "avg", path, "output_token_throughput")
    in_rate = total_in / duration if total_in is not None and duration else None
    latency = {metric: _latency(doc, name, path) for metric, name in METRICS.items()}
    point = {
        "concurrency": conc, "num_prompts": completed + failed, "completed": completed,
        "failed": failed, "duration_s": duration,
        "input_tokens": total_in, "output_tokens": total_out,
        "tput_per_gpu": per_gpu(None if in_rate is None or out_rate is None else in_rate + out_rate, gpus),
        "output_tput_per_gpu": per_gpu(out_rate, gpus), "input_tput_per_gpu": per_gpu(in_rate, gpus),
        "interactivity": interactivity(latency["tpot_ms"]), **latency,
    }
    run = base_run(opts, engine=None, model=model, num_gpus=gpus,
                   started_at=str(doc.get("start_time") or ""), isl=isl if isinstance(isl, int) else None,
                   osl=osl if isinstance(osl, int) else None,
                   extra={"aiperf_version": doc.get("aiperf_version"), "was_cancelled": doc.get("was_cancelled")})
    if not run["started_at"]:
        raise UserError(f"{path}: no start_time")
    return Level(run=run, point=point, source=str(path))
