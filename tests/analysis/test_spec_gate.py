"""Speculative acceptance is gated like any catalogue metric: on the committed 'noise2' history (five
baseline runs and a candidate whose other metrics moved only by noise), acceptance length around 2.8
with 1% run-to-run noise, then the candidate's at 2.2 (a 21% drop): `k2bench regress` fails on it; the
same candidate with acceptance inside the noise passes. Acceptance comes from counters over a window,
so there is no per-request sample: the verdict rests on the baseline history (the noise test)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from analysis_data import load_fixture

from k2bench.harness.cli import main
from k2bench.harness.store import Store


def _store(tmp_path, cand_len: float, cand_rate: float) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path / 'k2.db'}"
    fx = load_fixture("noise2")
    rng = np.random.default_rng(28)
    store = Store.open(url)
    for i, doc in enumerate(fx["runs"]):
        last = i == len(fx["runs"]) - 1
        for p in doc["points"]:
            noise = 1 + 0.01 * rng.standard_normal()
            p["spec_accept_len"] = (cand_len if last else 2.8) * noise
            p["spec_accept_rate"] = (cand_rate if last else 0.6) * noise
        store.import_run(doc)
    store.close()
    return url, fx["runs"][-1]["run"]["commit"][:12]


def _regress(url: str, cand: str, capsys) -> tuple[int, dict]:
    code = main(["regress", "--candidate", cand, "--baseline-mode", "latest", "--db", url, "--format", "json",
                 "--fail-on-regression"])
    return code, json.loads(capsys.readouterr().out)


def _spec(doc: dict) -> dict[tuple[str, int], str]:
    return {(v["metric"], v["concurrency"]): v["status"] for v in doc["verdicts"] if v["metric"].startswith("spec_")}


def test_a_drop_in_acceptance_length_fails_the_gate(tmp_path, capsys):
    # 2.2 tokens per step: (2.2 - 1) / (2.8 - 1) of the accepted drafts, so the rate drops in proportion
    url, cand = _store(tmp_path, 2.2, 0.6 * 1.2 / 1.8)
    code, doc = _regress(url, cand, capsys)
    assert code == 1 and doc["overall"] == "regression"
    verdicts = _spec(doc)
    levels = (4, 8, 16, 32, 64)
    assert all(verdicts[("spec_accept_len", c)] == "regression" for c in levels), verdicts
    assert all(verdicts[("spec_accept_rate", c)] == "regression" for c in levels), verdicts
    drop = next(v for v in doc["verdicts"] if v["metric"] == "spec_accept_len" and v["concurrency"] == 16)
    assert drop["rel_change"] == pytest.approx(2.2 / 2.8 - 1, abs=0.03) and drop["noise_p"] < 0.01


def test_acceptance_within_its_noise_passes(tmp_path, capsys):
    url, cand = _store(tmp_path, 2.8, 0.6)
    code, doc = _regress(url, cand, capsys)
    assert code == 0 and doc["overall"] == "unchanged"
    assert set(_spec(doc).values()) == {"unchanged"}


def test_the_nightly_scan_finds_a_step_in_acceptance_length():
    """60 runs of the 'step60' history with acceptance length 2.8 (1% noise) until the commit after run 50,
    then 2.2: the default change-point scan (the gated metrics) names that commit at every level."""
    from analysis_data import frame

    from k2bench.harness.analysis import changepoints as cp

    fx = load_fixture("step60")
    rng = np.random.default_rng(60)
    points = frame(fx["runs"])  # runs numbered from 1 in fixture order
    step = points["run_id"] > 50
    points["spec_accept_len"] = np.where(step, 2.2, 2.8) * (1 + 0.01 * rng.standard_normal(len(points)))
    assert "spec_accept_len" in cp.default_metrics()
    rows = [r for r in cp.history_change_points(points) if r["metric"] == "spec_accept_len"]
    assert {r["concurrency"] for r in rows} == {4, 8, 16, 32, 64}
    assert {r["commit"] for r in rows} == {fx["runs"][50]["run"]["commit"]}
    assert all(r["rel_change"] == pytest.approx(2.2 / 2.8 - 1, abs=0.03) for r in rows)
