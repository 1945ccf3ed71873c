"""Pieces of the dashboard's data layer checked against independent references."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from k2bench.dashboard import data
from k2bench.dashboard.reference import load_reference, reference_dir

SEED = Path("/work/shared/seeds/000_c0319a7e737c6c5c.txt")


def brute_force_front(x, y, max_x, max_y):
    sx, sy = (1 if max_x else -1), (1 if max_y else -1)
    out = []
    for i in range(len(x)):
        dominated = any(sx * x[j] >= sx * x[i] and sy * y[j] >= sy * y[i]
                        and (sx * x[j] > sx * x[i] or sy * y[j] > sy * y[i]) for j in range(len(x)))
        out.append(not dominated)
    return np.array(out)


@pytest.mark.parametrize("max_x,max_y", list(itertools.product([True, False], repeat=2)))
def test_pareto_mask_matches_brute_force(max_x, max_y):
    rng = np.random.default_rng(7)
    for _ in range(20):
        x = rng.integers(1, 12, 30).astype(float)  # small integers: plenty of ties
        y = rng.integers(1, 12, 30).astype(float)
        got = data.pareto_mask(x, y, max_x, max_y)
        want = brute_force_front(x, y, max_x, max_y)
        # exact duplicates of a frontier point may be kept once or more; compare the distinct points
        assert {(a, b) for a, b, m in zip(x, y, got, strict=True) if m} == {(a, b) for a, b, m in zip(x, y, want, strict=True) if m}


def test_matched_interactivity_interpolates_inside_the_overlap_only():
    a = pd.DataFrame({"concurrency": [4, 8, 16, 32], "interactivity_median": [100.0, 80.0, 60.0, 40.0],
                      "tput_per_gpu": [1000.0, 1800.0, 3000.0, 4000.0]})
    b = a.assign(interactivity_median=a["interactivity_median"] * 0.9, tput_per_gpu=a["tput_per_gpu"] * 0.9)
    out = data.matched_interactivity(a, b)
    # B covers interactivity 36..90: A's levels at 80 and 60 and 40 are inside, 100 is not
    assert list(out["concurrency A"]) == [32, 16, 8]
    assert (out["Δ%"] < 0).all()


def test_delta_table_sign_follows_b_minus_a():
    a = pd.DataFrame({"concurrency": [4, 8], **{m: [10.0, 20.0] for m in data.COMPARE_METRICS}})
    b = pd.DataFrame({"concurrency": [8, 4], **{m: [30.0, 5.0] for m in data.COMPARE_METRICS}})
    out = data.delta_table(a, b)
    assert list(out["concurrency"]) == [4, 8]
    assert list(out["tput_per_gpu Δ%"]) == pytest.approx([-50.0, 50.0])


def test_reference_points_are_the_published_figures_with_their_source():
    ref = load_reference()
    assert len(ref) == 2
    c128 = ref[ref["concurrency"] == 128].iloc[0]
    c4 = ref[ref["concurrency"] == 4].iloc[0]
    assert (c128["tput_per_gpu"], c128["interactivity_median"]) == (5369.6, 19.2)
    assert c4["interactivity_median"] == 116.4 and pd.isna(c4["tput_per_gpu"])
    assert "MI355X" in c128["source"] and c128["source"].startswith("AMD")


def test_reference_quote_is_verbatim_from_the_seed():
    if not SEED.exists():
        pytest.skip("the seed text is not on this machine")
    (path,) = reference_dir().glob("mi355x_*.json")
    quote = json.loads(path.read_text())["source"]["quote"]
    assert quote in SEED.read_text()


def test_dashboard_store_is_read_only(tmp_path):
    from k2bench.errors import UserError
    from k2bench.harness.store import Store

    url = f"sqlite:///{tmp_path / 'ro.db'}"
    Store.open(url).close()
    store = data.open_store(url)
    try:
        with pytest.raises(UserError, match="read-only"):
            store.create_run({"engine": "x", "model": "m", "num_gpus": 1})
    finally:
        store.close()


@pytest.mark.parametrize("n", [1, 4, 12_001])
def test_itl_cdf_is_the_fraction_of_gaps_at_or_below_x(n):
    from k2bench.dashboard.charts import itl_cdf

    gaps = np.random.default_rng(n).permutation(np.arange(1, n + 1)) * 0.5  # distinct gaps, shuffled
    trace = itl_cdf(gaps).data[0]
    xs, ys = np.asarray(trace.x, dtype=float), np.asarray(trace.y, dtype=float)
    assert len(xs) == min(n, 5000) and xs[-1] == gaps.max()
    assert np.allclose(ys, [(gaps <= x).mean() for x in xs])


def test_config_labels_match_runs_with_missing_fields() -> None:
    """An imported run may lack tp or hardware (NaN in the frame); NaN != NaN must not lose its label."""
    df = pd.DataFrame({"engine": ["unknown", "unknown", "vllm"], "engine_version": [None, None, "1"],
                       "model": ["m", "m", "m"], "precision": [None, None, "bf16"],
                       "hardware": [float("nan"), float("nan"), "H200"], "num_gpus": [1, 1, 2],
                       "tp": [float("nan"), float("nan"), 2.0], "workload": [None, None, "8k1k"],
                       "fingerprint": ["aaaaaa11", "aaaaaa11", "bbbbbb22"]})
    labels = data.config_labels(df)
    assert list(labels) == ["unknown · m [aaaaaa]", "unknown · m [aaaaaa]", "vllm 1 · m · bf16 · H200 · TP2 · 8k1k [bbbbbb]"]
