"""Cost per million tokens: the formula against hand arithmetic, the shipped price table (every entry
sourced and dated, found by the hardware name a run records), overrides and recomputation."""

from __future__ import annotations

import re

import pytest

from k2bench.errors import UserError
from k2bench.harness import data
from k2bench.harness.telemetry import cost


def test_usd_per_mtok_is_price_per_second_over_tokens_per_second():
    # $3.60 per GPU-hour is $0.001 per GPU-second; 1000 tok/s/GPU -> 1e6 tokens cost $1.00
    c = cost.level_cost(3.60, tput_per_gpu=1000.0, output_tput_per_gpu=100.0)
    assert c == {"gpu_hour_usd": 3.60, "usd_per_mtok": pytest.approx(1.0), "usd_per_mtok_output": pytest.approx(10.0)}
    assert cost.level_cost(None, 1000.0, 100.0) is None
    assert cost.usd_per_mtok(2.0, 0.0) is None and cost.usd_per_mtok(2.0, None) is None


def test_a_stored_level_is_recomputed_at_a_new_price():
    point = {"tput_per_gpu": 5369.6, "output_tput_per_gpu": 596.6}
    old = cost.recompute(point, 2.0)
    new = cost.recompute(point, 3.0, source="new contract")
    assert new["usd_per_mtok"] == pytest.approx(old["usd_per_mtok"] * 1.5)
    assert new["usd_per_mtok_output"] == pytest.approx(3.0 / 3600 / 596.6 * 1e6)
    assert new["price_source"] == "new contract"


def test_every_shipped_price_has_a_source_a_date_and_a_positive_value():
    table = data.load(cost.PRICES)
    assert {"H100", "H200", "B200", "MI300X"} <= set(table)
    for key, entry in table.items():
        assert entry["usd_per_gpu_hour"] > 0, key
        assert entry["source"].startswith("https://"), key
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["date"]), key


def test_the_table_price_is_found_from_the_recorded_hardware_name():
    price, source = cost.resolve_price(None, "NVIDIA H200")
    assert price == data.load(cost.PRICES)["H200"]["usd_per_gpu_hour"]
    assert "nebius" in source.lower() and "2025-10-22" in source
    assert cost.resolve_price(None, "AMD Instinct MI325X")[0] == data.load(cost.PRICES)["MI325X"]["usd_per_gpu_hour"]
    price, why = cost.resolve_price(None, "cpu: AMD EPYC 7763")
    assert price is None and "--gpu-hour-usd" in why
    assert cost.resolve_price(4.25, "NVIDIA H200") == (4.25, "given by the user")


def test_the_longest_match_wins():
    table = {"A": {"match": ["H100"], "source": "s"}, "B": {"match": ["H100 NVL"], "source": "s"}}
    assert data.find(table, "NVIDIA H100 NVL")[0] == "B"
    assert data.find(table, "NVIDIA H100 80GB HBM3")[0] == "A"
    assert data.find(table, None) is None


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_price_is_a_user_error(bad):
    with pytest.raises(UserError, match="--gpu-hour-usd must be a positive number"):
        cost.resolve_price(bad, "NVIDIA H200")


def test_a_malformed_table_is_a_user_error(tmp_path):
    f = tmp_path / "prices.toml"
    f.write_text("[X]\nusd_per_gpu_hour = 1.0\n")
    with pytest.raises(UserError, match=r"\[X\] needs a `match` list and a `source`"):
        data.load("prices.toml", path=f)
    f.write_text("not = [toml")
    with pytest.raises(UserError, match="cannot read the table"):
        data.load("prices.toml", path=f)
