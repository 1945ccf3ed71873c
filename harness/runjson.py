"""The k2bench.run/1 JSON document: build, validate, parse.

A document is ``{"schema": "k2bench.run/1", "run": {...}, "points": [...], "requests": [...]}``
("requests" is optional). Validation returns a normalised copy and raises UserError naming the
first bad field by its path (for example ``points[2].ttft_ms.p99``). Unknown fields are errors,
so a typo is never silently dropped; free-form data goes in run.tags, run.notes, run.client,
run.extra or a point's extra.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness.metrics import INTERACTIVITY_KEYS, LATENCY_METRICS, STAT_KEYS

SCHEMA = "k2bench.run/1"
RUN_STATUSES = ("running", "complete", "partial", "failed")

# field -> (kind, required on import)
RUN_FIELDS: dict[str, tuple[str, bool]] = {
    "id": ("int?", False),
    "commit": ("str?", False),
    "branch": ("str?", False),
    "engine": ("str", True),
    "engine_version": ("str?", False),
    "engine_flags": ("json?", False),
    "server_command": ("str?", False),
    "model": ("str", True),
    "precision": ("str?", False),
    "hardware": ("str?", False),
    "num_gpus": ("pos_int", True),
    "tp": ("pos_int?", False),
    "workload": ("str?", False),
    "isl": ("pos_int?", False),
    "osl": ("pos_int?", False),
    "range_ratio": ("ratio?", False),
    "fingerprint": ("str?", False),
    "started_at": ("time", True),
    "finished_at": ("time?", False),
    "status": ("status", True),
    "tags": ("dict?", False),
    "trials": ("pos_int?", False),
    "client": ("dict?", False),
    "notes": ("str?", False),
    "extra": ("dict?", False),
}

POINT_SCALARS: dict[str, tuple[str, bool]] = {
    "concurrency": ("pos_int", True),
    "trial": ("nonneg_int?", False),
    "num_prompts": ("nonneg_int", True),
    "completed": ("nonneg_int", True),
    "failed": ("nonneg_int", True),
    "osl_mismatches": ("nonneg_int?", False),
    "errors": ("str_list?", False),
    "duration_s": ("float?", False),
    "input_tokens": ("nonneg_int?", False),
    "output_tokens": ("nonneg_int?", False),
    "tput_per_gpu": ("float?", False),
    "output_tput_per_gpu": ("float?", False),
    "input_tput_per_gpu": ("float?", False),
    "extra": ("dict?", False),
}

REQUEST_FIELDS: dict[str, tuple[str, bool]] = {
    "concurrency": ("pos_int", True),
    "trial": ("nonneg_int?", False),
    "index": ("nonneg_int", True),
    "warmup": ("bool", True),
    "requested_input_tokens": ("nonneg_int", True),
    "requested_output_tokens": ("nonneg_int", True),
    "send_ns": ("int", True),
    "end_ns": ("int?", False),
    "token_delta_ns": ("int_list", True),
    "prompt_tokens": ("nonneg_int?", False),
    "output_tokens": ("nonneg_int?", False),
    "success": ("bool", True),
    "error": ("str?", False),
}


def format_time(dt: datetime | None) -> str | None:
    """Canonical UTC ISO-8601 text, e.g. 2026-11-29T18:57:30.000000Z."""
    if dt is None:
        return None
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str, where: str = "time") -> datetime:
    """ISO-8601 text -> aware UTC datetime (text without an offset is taken as UTC)."""
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except (TypeError, ValueError):
        raise UserError(f"{where}: not an ISO-8601 time: {text!r}") from None
    if dt.tzinfo is None:
        return dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(kind: str, value, where: str):
    """Validate one value against its kind; return the normalised value."""
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    if value is None:
        if optional:
            return None
        raise UserError(f"{where}: required, got null")

    def bad(expected: str):
        return UserError(f"{where}: expected {expected}, got {value!r:.80}")

    if base == "str":
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if base == "int":
        if not _is_int(value):
            raise bad("an integer")
        return value
    if base in ("pos_int", "nonneg_int"):
        low = 1 if base == "pos_int" else 0
        if not _is_int(value) or value < low:
            raise bad(f"an integer >= {low}")
        return value
    if base == "float":  # finite: a NaN or Infinity would be stored, then refused by write_doc on export
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad("a finite number")
        return float(value)
    if base == "ratio":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise bad("a number between 0 and 1")
        return float(value)
    if base == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if base == "dict":
        if not isinstance(value, dict):
            raise bad("an object")
        return value
    if base == "json":
        if not isinstance(value, (dict, list, str)):
            raise bad("an object, list or string")
        return value
    if base == "str_list":
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise bad("a list of strings")
        return list(value)
    if base == "int_list":
        if not isinstance(value, list) or not all(_is_int(x) for x in value):
            raise bad("a list of integers")
        return list(value)
    if base == "time":
        if not isinstance(value, str):
            raise bad("an ISO-8601 time string")
        return format_time(parse_time(value, where))
    if base == "status":
        if value not in RUN_STATUSES:
            raise bad("one of " + ", ".join(RUN_STATUSES))
        return value
    raise AssertionError(f"unknown field kind {kind}")  # programming error, not user input


def _check_fields(obj, spec: dict[str, tuple[str, bool]], where: str, extra_ok: tuple[str, ...] = ()) -> dict:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected an object, got {type(obj).__name__}")
    for key in obj:
        if key not in spec and key not in extra_ok:
            raise UserError(f"{where}.{key}: unknown field")
    out = {}
    for key, (kind, required) in spec.items():
        if key not in obj:
            if required:
                raise UserError(f"{where}.{key}: missing")
            out[key] = None
            continue
        out[key] = _check(kind, obj[key], f"{where}.{key}")
    return out


def validate_run(run, where: str = "run") -> dict:
    return _check_fields(run, RUN_FIELDS, where)


def _check_stats(value, keys: tuple[str, ...], where: str) -> dict:
    if value is None:
        return {k: None for k in keys}
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected an object with keys {', '.join(keys)}")
    for key in value:
        if key not in keys:
            raise UserError(f"{where}.{key}: unknown field")
    return {k: _check("float?", value.get(k), f"{where}.{k}") for k in keys}


def validate_point(point, where: str = "point") -> dict:
    nested = ("interactivity", *LATENCY_METRICS)
    out = _check_fields(point, POINT_SCALARS, where, extra_ok=nested)
    out["trial"] = out["trial"] or 0
    out["osl_mismatches"] = out["osl_mismatches"] or 0
    out["errors"] = out["errors"] or []
    if out["completed"] + out["failed"] != out["num_prompts"]:
        raise UserError(f"{where}: completed + failed ({out['completed']} + {out['failed']}) != num_prompts ({out['num_prompts']})")
    out["interactivity"] = _check_stats(point.get("interactivity"), INTERACTIVITY_KEYS, f"{where}.interactivity")
    for metric in LATENCY_METRICS:
        out[metric] = _check_stats(point.get(metric), STAT_KEYS, f"{where}.{metric}")
    return out


def validate_request(req, where: str = "request") -> dict:
    out = _check_fields(req, REQUEST_FIELDS, where)
    out["trial"] = out["trial"] or 0
    return out


def validate_doc(doc) -> dict:
    """Check a whole document; return a normalised copy. Raises UserError on the first bad field."""
    if not isinstance(doc, dict):
        raise UserError("document: expected a JSON object")
    for key in doc:
        if key not in ("schema", "run", "points", "requests"):
            raise UserError(f"{key}: unknown top-level field")
    if doc.get("schema") != SCHEMA:
        raise UserError(f"schema: expected {SCHEMA!r}, got {doc.get('schema')!r}")
    if "run" not in doc:
        raise UserError("run: missing")
    run = validate_run(doc["run"])
    points_in = doc.get("points")
    if not isinstance(points_in, list):
        raise UserError("points: expected a list")
    points = [validate_point(p, f"points[{i}]") for i, p in enumerate(points_in)]
    seen: set[tuple[int, int]] = set()
    for i, p in enumerate(points):
        key = (p["concurrency"], p["trial"])
        if key in seen:
            raise UserError(f"points[{i}]: duplicate level (concurrency {key[0]}, trial {key[1]})")
        seen.add(key)
    out = {"schema": SCHEMA, "run": run, "points": points}
    if doc.get("requests") is not None:
        reqs_in = doc["requests"]
        if not isinstance(reqs_in, list):
            raise UserError("requests: expected a list")
        reqs = [validate_request(r, f"requests[{i}]") for i, r in enumerate(reqs_in)]
        for i, r in enumerate(reqs):
            if (r["concurrency"], r["trial"]) not in seen:
                raise UserError(
                    f"requests[{i}]: no point for concurrency {r['concurrency']}, trial {r['trial']}"
                )
        out["requests"] = reqs
    return out


def build_doc(run: dict, points: list[dict], requests: list[dict] | None = None) -> dict:
    doc = {"schema": SCHEMA, "run": run, "points": points}
    if requests is not None:
        doc["requests"] = requests
    return doc


def load_doc(path: str | Path) -> dict:
    """Read and validate a k2bench.run/1 file; errors name the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    try:
        return validate_doc(doc)
    except UserError as exc:
        raise UserError(f"{p}: {exc}") from None


def write_doc(doc: dict, path: str | Path) -> None:
    p = Path(path)
    try:
        if p.parent and not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{p}: cannot write: {exc.strerror or exc}") from None
