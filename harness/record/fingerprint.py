"""Benchmark-configuration fingerprint: two runs are comparable iff their fingerprints match.

The fingerprint covers everything that changes what is being measured (engine and its version
and flags, model, precision, hardware, parallelism, workload shape) and nothing that is expected
to vary between comparable runs (commit, branch, date, tags, host).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from k2bench.harness.record.schema import FINGERPRINT_FIELDS  # the Run fields declared with fingerprint=True

__all__ = ["FINGERPRINT_FIELDS", "fingerprint", "fingerprint_fields"]


def _canonical_number(value):
    # 1 and 1.0 must hash alike (a range ratio typed as "1" or "1.0").
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Fields added after fingerprints were first stored: left out while absent, so that a run without them
# keeps the fingerprint it always had (a closed-loop run has no arrival schedule; a workload of random
# fixed-length prompts has no definition beyond its name and lengths).
OPTIONAL_FIELDS = frozenset({"arrival", "workload_def"})


def fingerprint_fields(meta: Mapping) -> dict:
    """The exact dict that ``fingerprint`` hashes (missing fields are None; missing optional ones absent)."""
    return {name: _canonical_number(meta.get(name)) for name in FINGERPRINT_FIELDS
            if name not in OPTIONAL_FIELDS or meta.get(name) is not None}


def fingerprint(meta: Mapping) -> str:
    """sha256 (first 16 hex digits) of the canonical JSON of ``fingerprint_fields(meta)``."""
    text = json.dumps(fingerprint_fields(meta), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

