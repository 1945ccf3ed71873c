"""Trace replay in Mooncake's format: one request per line, ``{"timestamp": ms, "input_length": n,
"output_length": m, "hash_ids": [...]}``, where hash id ``h`` names one block of ``block_size`` prompt
tokens (512 in Mooncake's traces) and equal ids mean the same block (a shared prefix).

Prompts are built so that equal hash ids give identical token blocks: block ``h`` is drawn from a
generator seeded with (seed, h). The last block is cut where the input length ends; tokens beyond the
listed blocks are unique to the request. ``implied_hit_rate`` is what an unbounded prefix cache of the
same block size would hit, the figure a replay's measured hit rate is compared against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from k2bench.errors import UserError


@dataclass(frozen=True)
class TraceRow:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_trace(path: str | Path) -> list[TraceRow]:
    """The requests of a trace in file order; a malformed line is refused with its number."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read trace {path}: {exc}") from None
    rows: list[TraceRow] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise UserError(f"{path}, line {number}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}, line {number}: expected a JSON object")
        ts, ilen, olen, ids = (obj.get(k) for k in ("timestamp", "input_length", "output_length", "hash_ids"))
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
            raise UserError(f"{path}, line {number}: timestamp must be a number of milliseconds >= 0, got {ts!r}")
        for key, v in (("input_length", ilen), ("output_length", olen)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{path}, line {number}: {key} must be a whole number >= 1, got {v!r}")
        ids = [] if ids is None else ids
        if not (isinstance(ids, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in ids)):
            raise UserError(f"{path}, line {number}: hash_ids must be a list of whole numbers")
        if rows and ts < rows[-1].timestamp_ms:
            raise UserError(f"{path}, line {number}: timestamps must not go back ({ts} after "
                            f"{rows[-1].timestamp_ms})")
        rows.append(TraceRow(float(ts), ilen, olen, tuple(ids)))
    if not rows:
        raise UserError(f"{path}: the trace has no requests")
    return rows


def send_offsets_s(rows: list[TraceRow], time_scale: float = 1.0) -> list[float]:
    """Each request's send time in seconds after the first one's, the gaps scaled by ``time_scale``."""
    t0 = rows[0].timestamp_ms
    return [(r.timestamp_ms - t0) / 1e3 * time_scale for r in rows]


def _block(allowed: np.ndarray, seed: int, h: int, size: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 1, h & 0xFFFFFFFF, h >> 32 & 0xFFFFFFFF])
    return allowed[rng.integers(0, allowed.size, size=size)]


def prompt_ids(rows: list[TraceRow], allowed: np.ndarray, block_size: int, seed: int = 0) -> list[np.ndarray]:
    """Token ids of each request: its hash blocks (identical for equal ids), then unique tokens."""
    out = []
    for i, r in enumerate(rows):
        blocks = [_block(allowed, seed, h, block_size) for h in r.hash_ids]
        head = np.concatenate(blocks) if blocks else np.zeros(0, dtype=allowed.dtype)
        if head.size < r.input_length:
            rng = np.random.default_rng([seed, 2, i])
            tail = allowed[rng.integers(0, allowed.size, size=r.input_length - head.size)]
            head = np.concatenate([head, tail])
        out.append(head[: r.input_length].astype(np.int32))
    return out


def implied_hit_rate(rows: list[TraceRow], block_size: int) -> float:
    """Cached prompt tokens / prompt tokens for an unbounded cache of whole hash blocks, requests in order:
    a request hits the leading run of its blocks that an earlier request already held in full."""
    full: set[int] = set()  # hash ids seen as whole blocks
    hits = total = 0
    for r in rows:
        total += r.input_length
        for j, h in enumerate(r.hash_ids):
            if h not in full or (j + 1) * block_size > r.input_length:
                break
            hits += block_size
        for j, h in enumerate(r.hash_ids):
            if (j + 1) * block_size <= r.input_length:
                full.add(h)
    return hits / total if total else 0.0
