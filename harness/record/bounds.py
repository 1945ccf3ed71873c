"""What a stored value may be: strict JSON in, and the physical limits of a level's numbers.

Every run the store accepts passes through here, whether a sweep measured it or a file brought it
(`k2bench import`, with or without ``--from``), so nothing goes in that could not come out again as
strict JSON or that no server could have produced:

- JSON text must be UTF-8, without NaN/Infinity (nor a number that overflows to infinity), nested at
  most MAX_DEPTH deep, with integers inside the signed 64-bit range.
- Any value, anywhere in a document (run.extra and tags included): finite numbers, 64-bit integers,
  strings without NUL or lone surrogates (PostgreSQL refuses both), at most MAX_DEPTH deep.
- A level: durations > 0; latencies (the client's and the server's split) from 0 to MAX_LATENCY_MS;
  throughputs and interactivity from 0 to MAX_TOKENS_PER_S; energy and cost figures >= 0; an acceptance
  length >= 1 (a verification step yields at least the target model's own token).

MAX_TOKENS_PER_S is a physical bound, not a guess at today's best: at 2 FLOP per parameter per token,
even a 100M-parameter model would need 2e16 FLOP/s to pass 10^8 tokens/s, more than any accelerator's
peak, so a figure above it is a unit mistake or a corrupted file.
"""

from __future__ import annotations

import json
import math

from k2bench.errors import UserError

MAX_DEPTH = 64  # objects and lists inside each other; a k2bench document needs 4
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1  # SQL INTEGER columns (PostgreSQL's is 32-bit)
MAX_TOKENS_PER_S = 1e8  # per GPU (throughput) or per user (interactivity); see the module docstring
MAX_LATENCY_MS = 7 * 24 * 3600 * 1000.0  # a week: no single request waits longer
NAME_CAP = 200  # characters of a stored name (model, engine, branch, tag, ...): longer is refused

LATENCY_FIELDS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "server_queue_ms", "server_prefill_ms",
                  "server_decode_ms", "server_inference_ms")
RATE_FIELDS = ("tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu")
NONNEG_FIELDS = ("j_per_token", "tokens_per_j", "usd_per_mtok", "usd_per_mtok_output", "pct_roofline")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19:  # before int(): a 100,000-digit integer must not cost a conversion
        raise ValueError(f"integer {text[:24]}... is outside the 64-bit range")
    value = int(text)
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(f"integer {value} is outside the 64-bit range")
    return value


def parse_json(data: bytes | str, where: str) -> object:
    """Strict JSON, checked by check_tree; every problem is a UserError naming ``where`` (and the value's
    path: NaN, Infinity and 1e999 are read as floats first, so that check_tree can say where they are)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{where}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})") from None
    try:
        doc = json.loads(data, parse_int=_int)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise UserError(f"{where}: not valid JSON (nested more than {MAX_DEPTH} deep)") from None
    except ValueError as exc:
        raise UserError(f"{where}: not valid JSON ({exc})") from None
    try:
        check_tree(doc, "")
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    return doc


def check_tree(value: object, where: str) -> None:
    """Every value inside ``value`` storable and exportable as strict JSON (see the module docstring).
    ``where`` names ``value`` in messages ("" for a whole document: paths then read points[2].extra)."""
    stack = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise UserError(f"{path or 'document'}: nested more than {MAX_DEPTH} deep")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str):
                    _check_str(key, f"{path or 'document'} (a key)")
                name = (f"{path}.{key}" if path else str(key)) if isinstance(item, dict) else f"{path}[{key}]"
                stack.append((child, name, depth + 1))
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -INT64_MAX - 1 <= item <= INT64_MAX:
                raise UserError(f"{path or 'document'}: integer outside the 64-bit range")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise UserError(f"{path or 'document'}: expected a finite number, got {item}")
        elif isinstance(item, str):
            _check_str(item, path)


def _check_str(text: str, path: str) -> None:
    if "\x00" in text:
        raise UserError(f"{path or 'document'}: text contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{path or 'document'}: text is not valid Unicode (a lone surrogate)") from None


def check_name(text: str, cap: int, where: str) -> None:
    if len(text) > cap:
        raise UserError(f"{where}: {len(text)} characters; names are capped at {cap}")


def _in_range(value: float | None, low: float, high: float, where: str, *, above: bool = False) -> None:
    if value is None:
        return
    if value < low or (above and value == low) or value > high:
        bound = f"> {low:g}" if above else f">= {low:g}"
        if math.isfinite(high):
            bound += f" and <= {high:g}"
        raise UserError(f"{where}: {value:g} is not physical (expected {bound})")


def check_level(point: dict, where: str) -> None:
    """The physical limits of one validated level (module docstring)."""
    _in_range(point.get("duration_s"), 0.0, math.inf, f"{where}.duration_s", above=True)
    for name in RATE_FIELDS:
        _in_range(point.get(name), 0.0, MAX_TOKENS_PER_S, f"{where}.{name}")
    for key, value in (point.get("interactivity") or {}).items():
        _in_range(value, 0.0, MAX_TOKENS_PER_S, f"{where}.interactivity.{key}")
    for name in LATENCY_FIELDS:
        for key, value in (point.get(name) or {}).items():
            _in_range(value, 0.0, MAX_LATENCY_MS, f"{where}.{name}.{key}")
    for name in NONNEG_FIELDS:
        _in_range(point.get(name), 0.0, math.inf, f"{where}.{name}")
    _in_range(point.get("server_ttft_ms"), 0.0, MAX_LATENCY_MS, f"{where}.server_ttft_ms")
    _in_range(point.get("spec_accept_len"), 1.0, math.inf, f"{where}.spec_accept_len")
