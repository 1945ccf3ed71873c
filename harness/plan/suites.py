"""Benchmark suites: a TOML matrix of server configurations, expanded into jobs with stable ids.

A suite file reads like InferenceX's master configs::

    [suite]
    name = "nightly"
    [defaults]                 # every entry starts from these
    conc = "4..128"
    [[matrix]]                 # a list value expands as a product ...
    engine = "bundled"
    tp = [1, 2]
    workload = ["8k1k", "1k1k"]
    [[exclude]]                # ... a job matching every key of an exclude is dropped
    tp = 2
    workload = "1k1k"
    [[include]]                # ... and each include adds one job as written
    engine = "vllm"

``conc`` is a job's list of levels (one sweep per job), so it never expands. A job's id is its
readable key plus a hash of all its fields, so it survives reordering the file and changes when
anything that is measured changes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness.plan import settings

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# job field -> the TOML types it accepts (a list of them expands, except for conc and rate): the sweep settings
# that a suite file may carry, as `settings` declares them
FIELDS: dict[str, tuple[type, ...]] = {key: s.toml_types() for key, s in settings.FILE_KEYS.items()}
NO_EXPAND = {"conc", "rate"}
TOP_LEVEL = {"suite", "defaults", "matrix", "include", "exclude"}
SUITE_KEYS = {"name", "description"}


@dataclass(frozen=True)
class Job:
    id: str
    fields: dict

    def get(self, key: str, default=None):
        return self.fields.get(key, default)

    def matches(self, key: str, value: str) -> bool:
        """``--only KEY=VALUE``: the id, or a field compared as text."""
        if key == "id":
            return self.id == value
        have = self.fields.get(key)
        return have is not None and _text(have) == value


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: Path
    jobs: list[Job]

    def select(self, only: list[str] | None) -> list[Job]:
        """Jobs matching every ``KEY=VALUE`` (the same key twice: either value)."""
        wanted: dict[str, set[str]] = {}
        for item in only or []:
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise UserError(f"--only {item!r}: expected KEY=VALUE (e.g. id=... or tp=4)")
            if key != "id" and key not in FIELDS:
                raise UserError(f"--only {item!r}: unknown key {key!r}; known: id, {', '.join(sorted(FIELDS))}")
            wanted.setdefault(key, set()).add(value.strip())
        jobs = [j for j in self.jobs if all(any(j.matches(k, v) for v in vs) for k, vs in wanted.items())]
        if only and not jobs:
            raise UserError(f"--only {' '.join(only)}: no job of suite {self.name!r} matches "
                            f"(see `k2bench suite list {self.path}`)")
        return jobs


def _text(value) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _check_table(table, where: str) -> dict:
    if not isinstance(table, dict):
        raise UserError(f"{where}: expected a table of job fields")
    for key, value in table.items():
        if key not in FIELDS:
            raise UserError(f"{where}: unknown field {key!r}; known: {', '.join(sorted(FIELDS))}")
        values = value if isinstance(value, list) and key not in NO_EXPAND else [value]
        if isinstance(value, list) and key not in NO_EXPAND and not value:
            raise UserError(f"{where}: {key} is an empty list, which would expand to no job")
        for v in values:
            if isinstance(v, bool) != (bool in FIELDS[key]) or not isinstance(v, FIELDS[key]):
                kinds = " or ".join(t.__name__ for t in FIELDS[key])
                raise UserError(f"{where}: {key} = {v!r} must be {kinds} (or a list of them)")
            settings.check_value(key, v, where)  # isl = 0, conc = "3..5", ...: refused here, naming the key
    return table


def _expand(entry: dict) -> list[dict]:
    keys = sorted(entry)
    axes = [entry[k] if isinstance(entry[k], list) and k not in NO_EXPAND else [entry[k]] for k in keys]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*axes)]


def _excluded(job: dict, rules: list[dict]) -> bool:
    def hit(rule: dict) -> bool:
        return all(_text(job.get(k)) in {_text(v) for v in (val if isinstance(val, list) else [val])}
                   for k, val in rule.items())

    return any(hit(rule) for rule in rules)


def job_id(fields: dict) -> str:
    """Readable key (engine, model, tp, workload) plus 8 hex digits of a hash over every field."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:8]
    engine = fields.get("engine") or ("cmd" if fields.get("server_cmd") else "bundled")
    model = Path(str(fields["model"])).name if fields.get("model") else None
    workload = fields.get("workload") or (f"{fields.get('isl')}x{fields.get('osl')}" if fields.get("isl") else None)
    parts = [engine, model, f"tp{fields.get('tp', 1)}", workload, digest]
    return "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", str(p)) for p in parts if p)


def parse(doc: dict, path: Path) -> Suite:
    where = str(path)
    unknown = sorted(set(doc) - TOP_LEVEL)
    if unknown:
        raise UserError(f"{where}: unknown section {unknown[0]!r}; known: {', '.join(sorted(TOP_LEVEL))}")
    head = doc.get("suite", {})
    if not isinstance(head, dict) or set(head) - SUITE_KEYS:
        raise UserError(f"{where}: [suite] takes only {', '.join(sorted(SUITE_KEYS))}")
    defaults = _check_table(doc.get("defaults", {}), f"{where} [defaults]")
    sections = {}
    for name in ("matrix", "include", "exclude"):
        items = doc.get(name, [])
        if not isinstance(items, list):
            raise UserError(f"{where}: write [[{name}]] (an array of tables)")
        sections[name] = [_check_table(t, f"{where} [[{name}]] #{i + 1}") for i, t in enumerate(items)]
    if not sections["matrix"] and not sections["include"]:
        raise UserError(f"{where}: no [[matrix]] or [[include]] entry, so no job")
    expanded = [job for entry in sections["matrix"] for job in _expand({**defaults, **entry})]
    expanded = [j for j in expanded if not _excluded(j, sections["exclude"])]
    expanded += [job for entry in sections["include"] for job in _expand({**defaults, **entry})]
    jobs: dict[str, Job] = {}
    for fields in expanded:
        settings.check_job(fields, where)
        jid = job_id(fields)
        if jid not in jobs:  # an include that repeats a matrix job is the same job
            jobs[jid] = Job(jid, fields)
    if not jobs:
        raise UserError(f"{where}: every job is excluded")
    return Suite(name=str(head.get("name", path.stem)), description=str(head.get("description", "")),
                 path=path, jobs=list(jobs.values()))


def load(path: str | Path) -> Suite:
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"no suite file {p}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read suite {p}: {exc}") from None
    return parse(doc, p)
