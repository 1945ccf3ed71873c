"""The k2bench.run JSON document: build, validate, parse.

The fields and the version come from k2bench.harness.record.schema. A document is
``{"schema": "k2bench.run/<version>", "run": {...}, "points": [...], "evals": [...], "requests": [...]}``
("evals", from version 2, and "requests" are optional). Validation returns a normalised copy and raises UserError naming the
first bad field by its path (for example ``points[2].ttft_ms.p99``). Unknown fields are errors,
so a typo is never silently dropped; free-form data goes in run.tags, run.notes, run.client,
run.extra or a point's extra. What any value may be (finite, 64-bit, not too deep, physical for a
level's numbers, names at most bounds.NAME_CAP characters) is k2bench.harness.record.bounds'.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

from sqlalchemy import BigInteger, Integer, String, Text

from k2bench.errors import UserError
from k2bench.harness.record import bounds, schema
from k2bench.harness.record.schema import MODES, RUN_STATUSES, Spec, format_time, level_key, parse_time

__all__ = ["build_doc", "format_time", "load_doc", "parse_time", "schema_name", "upgrade_doc", "validate_doc",
           "validate_eval", "validate_evals", "validate_point", "validate_request", "validate_run",
           "validate_run_field", "write_doc"]


def schema_name() -> str:
    """The "schema" value this k2bench writes, e.g. k2bench.run/3."""
    return f"{schema.SCHEMA_PREFIX}{schema.SCHEMA_VERSION}"


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
    if base == "mode":
        if value not in MODES:
            raise bad("one of " + ", ".join(MODES))
        return value
    if base == "rate":  # requests/s; "inf" (JSON has no infinity) is a level that sends everything at once
        if value == "inf" or (isinstance(value, float) and math.isinf(value) and value > 0):
            return math.inf
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise bad('a positive number of requests/s or "inf"')
        return float(value)
    if base == "status":
        if value not in RUN_STATUSES:
            raise bad("one of " + ", ".join(RUN_STATUSES))
        return value
    raise AssertionError(f"unknown field kind {kind}")  # programming error, not user input


def _check_stats(value, keys: tuple[str, ...], where: str) -> dict:
    if value is None:
        return {k: None for k in keys}
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected an object with keys {', '.join(keys)}")
    for key in value:
        if key not in keys:
            raise UserError(f"{where}.{key}: unknown field")
    return {k: _check("float?", value.get(k), f"{where}.{k}") for k in keys}


def _check_fields(obj, fields: tuple[Spec, ...], where: str) -> dict:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected an object, got {type(obj).__name__}")
    names = {s.name for s in fields}
    for key in obj:
        if key not in names:
            raise UserError(f"{where}.{key}: unknown field")
    out = {}
    for s in fields:
        if s.name not in obj and s.required:
            raise UserError(f"{where}.{s.name}: missing")
        value = obj.get(s.name)
        if s.base == "stats":
            out[s.name] = _check_stats(value, s.keys, f"{where}.{s.name}")
            continue
        out[s.name] = None if s.name not in obj else _check(s.kind, value, f"{where}.{s.name}")
        if out[s.name] is None and s.default is not None:
            out[s.name] = copy.copy(s.default)
        _check_column(s, out[s.name], f"{where}.{s.name}")
    return out


def _check_column(s: Spec, value, where: str) -> None:
    """What the value's SQL column can hold: a name's length, an INTEGER's 32 bits."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str) and isinstance(s.sql, String) and not isinstance(s.sql, Text) and s.sql.length:
        bounds.check_name(value, min(bounds.NAME_CAP, s.sql.length), where)
    elif isinstance(value, int) and isinstance(s.sql, Integer) and not isinstance(s.sql, BigInteger):
        if not -bounds.INT32_MAX - 1 <= value <= bounds.INT32_MAX:
            raise UserError(f"{where}: {value} is outside the 32-bit range of its column")


def validate_run(run, where: str = "run") -> dict:
    bounds.check_tree(run, where)
    out = _check_fields(run, schema.RUN, where)
    for key, value in (out["tags"] or {}).items():
        bounds.check_name(key, bounds.NAME_CAP, f"{where}.tags (a key)")
        if isinstance(value, str):
            bounds.check_name(value, bounds.NAME_CAP, f"{where}.tags.{key}")
    return out


def validate_run_field(name: str, value, where: str = "run") -> object:
    """One run field set after the run was created (e.g. its profile), checked as an import checks it."""
    spec = next(f for f in schema.RUN if f.name == name)
    return _check(spec.kind, value, f"{where}.{name}")


def validate_point(point, where: str = "point") -> dict:
    bounds.check_tree(_finite_rate(point), where)
    out = _check_fields(point, schema.POINT, where)
    bounds.check_level(out, where)
    if out["valid"] is None:  # a level summarised without a validity verdict counts when nothing failed
        out["valid"] = out["failed"] in (0, None)  # (no counts: an imported result, taken as its source gave it)
        if not out["valid"] and out["invalid_reason"] is None:
            out["invalid_reason"] = f"{out['failed']} of {out['num_prompts']} requests failed"
    counts = [out[k] for k in ("num_prompts", "completed", "failed")]
    if all(c is None for c in counts):  # an imported result without request counts
        return out
    if any(c is None for c in counts):
        raise UserError(f"{where}: num_prompts, completed and failed are given together or all null")
    if out["completed"] + out["failed"] != out["num_prompts"]:
        raise UserError(f"{where}: completed + failed ({out['completed']} + {out['failed']}) != num_prompts ({out['num_prompts']})")
    return out


def validate_request(req, where: str = "request") -> dict:
    bounds.check_tree(_finite_rate(req), where)
    out = _check_fields(req, schema.REQUEST, where)
    last = out["send_ns"] + sum(out["token_delta_ns"])  # the stamps are stored as int64 from send_ns
    if not -bounds.INT64_MAX - 1 <= last <= bounds.INT64_MAX:
        raise UserError(f"{where}.token_delta_ns: the stamps leave the 64-bit range")
    return out


def validate_eval(ev, where: str = "eval") -> dict:
    bounds.check_tree(ev, where)
    out = _check_fields(ev, schema.EVAL, where)
    items = out["items"]
    if items is not None:
        if not isinstance(items, list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in items):
            raise UserError(f"{where}.items: expected a list of finite numbers")
        if len(items) != out["n"]:
            raise UserError(f"{where}.items: {len(items)} scores for n = {out['n']}")
    return out


def validate_evals(evals, where: str = "evals") -> list[dict]:
    """The optional top-level list of accuracy evaluations (absent or null: none)."""
    if evals is None:
        return []
    if not isinstance(evals, list):
        raise UserError(f"{where}: expected a list")
    return [validate_eval(e, f"{where}[{i}]") for i, e in enumerate(evals)]


def upgrade_doc(doc: dict) -> dict:
    """A document of an older schema version brought to the current one through schema.UPGRADES."""
    name = doc.get("schema")
    match = re.fullmatch(re.escape(schema.SCHEMA_PREFIX) + r"([1-9][0-9]*)", name) if isinstance(name, str) else None
    if match is None:
        raise UserError(f"schema: expected {schema_name()!r}, got {name!r}")
    version = int(match.group(1))
    if version > schema.SCHEMA_VERSION:
        raise UserError(f"schema: {name!r} was written by a newer k2bench (this one reads up to "
                        f"{schema_name()!r}); upgrade k2bench")
    while version < schema.SCHEMA_VERSION:
        doc = schema.UPGRADES[version](copy.deepcopy(doc))
        version += 1
        doc["schema"] = f"{schema.SCHEMA_PREFIX}{version}"
    return doc


def validate_doc(doc) -> dict:
    """Check a whole document (upgraded from an older version first); return a normalised copy.

    Raises UserError on the first bad field."""
    if not isinstance(doc, dict):
        raise UserError("document: expected a JSON object")
    if isinstance(doc.get("points"), list) and all(isinstance(p, dict) for p in doc["points"]) and (
            doc.get("requests") is None or isinstance(doc["requests"], list)
            and all(isinstance(r, dict) for r in doc["requests"])):
        doc = json_ready(doc)  # a document built in memory carries an infinite rate as a float
    bounds.check_tree(doc, "")  # before anything walks it (upgrades copy it recursively)
    for key in doc:
        if key not in ("schema", "run", "points", "requests", "evals"):
            raise UserError(f"{key}: unknown top-level field")
    if not isinstance(doc.get("points"), list):  # before the upgrades, which walk the points
        raise UserError("points: expected a list")
    doc = upgrade_doc(doc)
    if "run" not in doc:
        raise UserError("run: missing")
    run = validate_run(doc["run"])
    points = [validate_point(p, f"points[{i}]") for i, p in enumerate(doc["points"])]
    seen: set[tuple] = set()
    for i, p in enumerate(points):
        if (p["mode"] == "rate") != (p["rate"] is not None):
            raise UserError(f"points[{i}]: a rate level needs a rate, and only a rate level has one")
        key = level_key(p)
        if key in seen:
            raise UserError(f"points[{i}]: duplicate level ({_level_text(key)})")
        seen.add(key)
    out = {"schema": schema_name(), "run": run, "points": points,
           "evals": validate_evals(doc.get("evals"))}
    if doc.get("requests") is not None:
        reqs_in = doc["requests"]
        if not isinstance(reqs_in, list):
            raise UserError("requests: expected a list")
        reqs = [validate_request(r, f"requests[{i}]") for i, r in enumerate(reqs_in)]
        for i, r in enumerate(reqs):
            if level_key(r) not in seen:
                raise UserError(f"requests[{i}]: no point for {_level_text(level_key(r))}")
        out["requests"] = reqs
    return out


def build_doc(run: dict, points: list[dict], requests: list[dict] | None = None,
              evals: list[dict] | None = None) -> dict:
    doc = {"schema": schema_name(), "run": run, "points": points, "evals": evals or []}
    if requests is not None:
        doc["requests"] = requests
    return doc


def load_doc(path: str | Path) -> dict:
    """Read, upgrade and validate a k2bench.run file; errors name the file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise UserError(f"{p}: cannot read: {exc.strerror or exc}") from None
    doc = bounds.parse_json(data, str(p))
    try:
        return validate_doc(doc)
    except UserError as exc:
        raise UserError(f"{p}: {exc}") from None


def _finite_rate(obj):
    """``obj`` as the tree check sees it: an infinite level rate is allowed (it means "all at once")."""
    if isinstance(obj, dict) and isinstance(obj.get("rate"), float) and math.isinf(obj["rate"]):
        return {**obj, "rate": "inf"}
    return obj


def _level_text(key: tuple) -> str:
    mode, rate, conc, trial = key
    return (f"concurrency {conc}" if mode == "closed" else f"rate {rate:g}/s, concurrency {conc}") + f", trial {trial}"


def json_ready(doc: dict) -> dict:
    """``doc`` with every infinite level rate written as "inf" (JSON has no infinity)."""
    def fix(rows):
        return [{**r, "rate": "inf"} if isinstance(r.get("rate"), float) and math.isinf(r["rate"]) else r
                for r in rows]
    out = {**doc, "points": fix(doc.get("points") or [])}
    if doc.get("requests") is not None:
        out["requests"] = fix(doc["requests"])
    return out


def write_doc(doc: dict, path: str | Path) -> None:
    doc = json_ready(doc)
    p = Path(path)
    try:
        if p.parent and not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{p}: cannot write: {exc.strerror or exc}") from None
