"""Dollars per million tokens from a GPU-hour price and a level's throughput per GPU.

usd_per_mtok = price / 3600 / (tok/s/GPU) x 1e6, for all tokens and for output tokens alone.
Each level stores the price it used, so the figures can be recomputed when prices change
(`recompute`). The price is the user's (--gpu-hour-usd, a suite entry) or the shipped table's
entry for the run's hardware, with its source; no price means no cost, with the reason why.
"""

from __future__ import annotations

import math

from k2bench.errors import UserError
from k2bench.harness import data

PRICES = "gpu_prices.toml"


def check_price(value: float, flag: str = "--gpu-hour-usd") -> float:
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{flag} must be a positive number of US dollars per GPU-hour, not {value!r}")
    return float(value)


def resolve_price(override: float | None, hardware: str | None,
                  table: dict[str, dict] | None = None) -> tuple[float | None, str]:
    """(price per GPU-hour, where it came from) or (None, why there is none)."""
    if override is not None:
        return check_price(override), "given by the user"
    table = data.load(PRICES) if table is None else table
    hit = data.find(table, hardware)
    if hit is None:
        return None, f"no GPU-hour price for {hardware or 'unknown hardware'!r}: pass --gpu-hour-usd"
    key, entry = hit
    return check_price(entry["usd_per_gpu_hour"], f"{PRICES} [{key}]"), (
        f"{entry.get('provider', key)}, {entry['date']}: {entry['source']}")


def usd_per_mtok(gpu_hour_usd: float, tok_s_per_gpu: float | None) -> float | None:
    if tok_s_per_gpu is None or not tok_s_per_gpu > 0:
        return None
    return gpu_hour_usd / 3600.0 / tok_s_per_gpu * 1e6


def level_cost(gpu_hour_usd: float | None, tput_per_gpu: float | None, output_tput_per_gpu: float | None,
               source: str | None = None) -> dict | None:
    """The `cost` of one level, or None without a price."""
    if gpu_hour_usd is None:
        return None
    out = {"gpu_hour_usd": gpu_hour_usd, "usd_per_mtok": usd_per_mtok(gpu_hour_usd, tput_per_gpu),
           "usd_per_mtok_output": usd_per_mtok(gpu_hour_usd, output_tput_per_gpu)}
    if source:
        out["price_source"] = source
    return out


def recompute(point: dict, gpu_hour_usd: float, source: str | None = None) -> dict:
    """A stored level's cost at another price (its throughput is what it was)."""
    return level_cost(check_price(gpu_hour_usd), point.get("tput_per_gpu"), point.get("output_tput_per_gpu"),
                      source)
