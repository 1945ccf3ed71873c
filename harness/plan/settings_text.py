"""The text forms a sweep's settings are written in, on the command line and in suite files alike:
levels (``4..128``, ``4,8,32``, ``64``), rates (``2,4,inf``), per-level counts (``40`` or ``2x``), tags (``key=value``) and
evaluations (``TASK[@CONC]``).

Each parser takes the name the value was given under (``--conc`` on the command line, ``conc`` in a
file) so its error says where the bad text came from. Cheap to import: no third-party module.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from k2bench.errors import UserError

MAX_CONCURRENCY = 1 << 16


class Count(NamedTuple):
    """Requests per level: ``n`` of them, or ``x`` times the level's concurrency (one of the two)."""

    n: int | None
    x: float | None


def parse_concurrency(text: str, name: str = "--conc") -> list[int]:
    """``4..128`` (powers of two from 4 to 128 inclusive), ``4,8,32`` or ``64``; else UserError."""
    spec = text.strip()
    m = re.fullmatch(r"(\d+)\s*\.\.\s*(\d+)", spec)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo < 1 or hi < 1:
            raise UserError(f"{name} {spec!r}: bounds must be at least 1")
        if lo > hi:
            raise UserError(f"{name} {spec!r}: the lower bound is above the upper bound")
        if lo & (lo - 1) or hi & (hi - 1):
            raise UserError(f"{name} {spec!r}: a range runs over powers of two, so both bounds must be powers "
                            f"of two (e.g. 4..128); list other levels explicitly, e.g. 4,12,48")
        levels = []
        c = lo
        while c <= hi:
            levels.append(c)
            c *= 2
        return _check_levels(levels, spec, name)
    if re.fullmatch(r"\d+(\s*,\s*\d+)*", spec):
        return _check_levels([int(x) for x in spec.split(",")], spec, name)
    raise UserError(f"{name} {spec!r}: expected a range of powers of two like 4..128, a list like 4,8,32, "
                    f"or one number like 64")


def _check_levels(levels: list[int], spec: str, name: str) -> list[int]:
    for c in levels:
        if c < 1:
            raise UserError(f"{name} {spec!r}: concurrency must be at least 1")
        if c > MAX_CONCURRENCY:
            raise UserError(f"{name} {spec!r}: concurrency {c} is above the limit {MAX_CONCURRENCY}")
    if len(set(levels)) != len(levels):
        raise UserError(f"{name} {spec!r}: a level is listed twice")
    return levels


def parse_count(text: str | None, name: str) -> Count:
    """'40' -> Count(40, None): that many per level; '2x' -> Count(None, 2.0): twice each level's
    concurrency; None -> Count(None, None): the default."""
    if text is None:
        return Count(None, None)
    t = text.strip().lower()
    try:
        if t.endswith("x"):
            multiple = float(t[:-1])
            if math.isfinite(multiple):  # "nanx" / "infx" would only fail later, as a traceback
                return Count(None, multiple)
        else:
            return Count(int(t), None)
    except ValueError:
        pass
    raise UserError(f"{name} takes a count (40) or a multiple of the concurrency (2x), not {text!r}")


def parse_tags(items: list[str] | None, name: str = "--tag") -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{name} {item!r}: expected key=value")
        tags[key.strip()] = value.strip()
    return tags


def parse_evals(items: list[str], name: str = "--eval") -> list[tuple[str, int | None]]:
    """'tiny-arith' -> ('tiny-arith', None); 'gsm8k@64' -> ('gsm8k', 64); 'none' alone -> nothing.
    The task names are checked against the task list (imported here, lazily)."""
    from k2bench.harness.eval.tasks import get_task

    given = [item.strip() for item in items]
    if "none" in given:
        if given != ["none"]:
            raise UserError(f"{name} none evaluates nothing; it cannot be combined with tasks")
        return []
    out = []
    for item in given:
        task, sep, conc = item.partition("@")
        get_task(task.strip())
        if sep and not (conc.strip().isdigit() and int(conc) >= 1):
            raise UserError(f"{name} {item!r}: expected TASK or TASK@CONC with CONC a positive integer")
        out.append((task.strip(), int(conc) if sep else None))
    return out


def parse_rates(text: str, name: str = "--rate") -> list[float]:
    """``2,4,8`` or ``0.5,inf``: requests per second of each rate level (``inf``: all at once); else UserError."""
    spec = text.strip()
    rates: list[float] = []
    for part in spec.split(","):
        word = part.strip().lower()
        try:
            rate = math.inf if word == "inf" else float(word)
        except ValueError:
            raise UserError(f"{name} {spec!r}: {part.strip()!r} is not a number of requests per second "
                            f"(e.g. --rate 2,4,8 or --rate inf)") from None
        if not (rate > 0) or (math.isinf(rate) and word != "inf"):
            raise UserError(f"{name} {spec!r}: a rate must be a positive number of requests per second, or inf")
        if rate in rates:
            raise UserError(f"{name} {spec!r}: a rate is listed twice")
        rates.append(rate)
    return rates
