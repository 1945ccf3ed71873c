"""Shipped reference tables as data (GPU-hour prices, hardware peaks), each figure with its source and
date, and the one way to find a run's hardware in them."""

from __future__ import annotations

from pathlib import Path

from k2bench.errors import UserError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

HERE = Path(__file__).parent


def load(name: str, path: Path | None = None) -> dict[str, dict]:
    """A table by file name (``gpu_prices.toml``) or explicit path; UserError if unreadable."""
    file = path or HERE / name
    try:
        doc = tomllib.loads(file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read the table {file}: {exc}") from None
    for key, entry in doc.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("match"), list) or "source" not in entry:
            raise UserError(f"{file}: [{key}] needs a `match` list and a `source`")
    return doc


def find(table: dict[str, dict], hardware: str | None) -> tuple[str, dict] | None:
    """The entry whose longest `match` substring occurs in the hardware name (case-insensitive)."""
    if not hardware:
        return None
    name = hardware.lower()
    best: tuple[int, str] | None = None
    for key, entry in table.items():
        for pattern in entry["match"]:
            if pattern.lower() in name and (best is None or len(pattern) > best[0]):
                best = (len(pattern), key)
    return None if best is None else (best[1], table[best[1]])
