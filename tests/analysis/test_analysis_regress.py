"""Verdicts on committed fixture histories with known answers (frames built without the store)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from analysis_data import fixture_frames, frame, load_fixture

from k2bench.harness.analysis import baseline as bl
from k2bench.harness.analysis.regress import RegressConfig, compare


def _run(name, **cfg):
    hist, cand, fx = fixture_frames(name)
    return compare(cand, hist, hist, config=RegressConfig(**cfg)), fx


def _flagged(res, status):
    return sorted([v.metric, v.concurrency] for v in res.verdicts if v.status == status)


def test_ten_percent_drop_at_one_concurrency_is_flagged():
    res, fx = _run("drop10")
    assert res.overall == "regression"
    assert _flagged(res, "regression") == fx["expected"]["regressions"] == [["tput_per_gpu", 16]]
    v = next(v for v in res.regressions)
    assert v.rel_change == pytest.approx(-0.10, abs=0.02) and v.noise_p < 0.01
    assert v.factor == pytest.approx(v.baseline / v.candidate)
    assert res.frontier.status == "unchanged"  # one point of five: the curve as a whole barely moved


def test_two_percent_noise_is_not_flagged():
    res, _ = _run("noise2")
    assert res.overall == "unchanged"
    assert _flagged(res, "regression") == [] and _flagged(res, "improvement") == []


def test_improvement_is_reported_as_such():
    res, fx = _run("improve12")
    assert res.overall == "improvement"
    assert _flagged(res, "regression") == []
    imp = _flagged(res, "improvement")
    for item in fx["expected"]["improvements_include"]:
        assert item in imp
    assert res.frontier.status == "improvement" and res.frontier.comparison.shift > 0.08


def test_frontier_shifted_down_is_flagged():
    res, _ = _run("frontier_down")
    assert res.frontier.status == "regression"
    assert res.frontier.comparison.shift == pytest.approx(-0.09, abs=0.02)
    assert res.frontier.significance_source == "history"


def test_frontier_that_only_traded_points_along_itself_is_not_flagged():
    res, _ = _run("frontier_trade")
    assert res.frontier.status == "unchanged"
    assert abs(res.frontier.comparison.shift) < 0.02
    # the per-level numbers did move a lot, which is what makes this a real test of the frontier verdict
    tput = [v for v in res.verdicts if v.metric == "tput_per_gpu"]
    assert all(v.rel_change > 0.1 for v in tput)


def test_per_metric_threshold_override():
    res, _ = _run("drop10", thresholds={"tput_per_gpu": 0.15})
    assert _flagged(res, "regression") == []
    assert any(v.status == "noise" or v.status == "unchanged" for v in res.verdicts if v.metric == "tput_per_gpu")


def test_unknown_threshold_metric_is_refused():
    with pytest.raises(ValueError, match="unknown metric"):
        _run("drop10", thresholds={"tok_per_s": 0.1})


def test_unlike_fingerprints_are_refused_with_the_differing_fields():
    fx = load_fixture("unlike")
    base, cand = fx["runs"][0]["run"], fx["runs"][-1]["run"]
    ok, why = bl.comparable(cand, base)
    assert not ok
    for name in fx["expected"]["fields"]:
        assert name in why
    assert "engine_version ('0.2' vs '0.1')" in why and "osl (256 vs 128)" in why
    assert "model" not in why
    assert bl.comparable(fx["runs"][1]["run"], base) == (True, "")


def _requests(conc, n, ttft, tpot, osl, rng):
    e2el = ttft + tpot * (osl - 1)
    jit = rng.normal(1, 0.03, (n, 2))
    return pd.DataFrame({"concurrency": conc, "trial": 0, "ttft_ms": ttft * jit[:, 0], "tpot_ms": tpot * jit[:, 1],
                         "e2el_ms": e2el * jit[:, 1], "output_tokens": osl, "success": True})


def test_single_baseline_run_per_request_samples_alone_never_confirm():
    """Merge-base case: one baseline run, no history spread. The per-request Mann-Whitney test is computed
    (and shown), but one run's requests share its machine state, so alone they cannot confirm a change
    between runs (issue 12): the change is unconfirmed and does not fail the gate."""
    hist, cand, _ = fixture_frames("drop10")
    base = hist[hist["run_id"] == hist["run_id"].max()]
    cand = cand.copy()
    cand.loc[:, "tpot_ms_median"] = base["tpot_ms_median"].to_numpy() * 1.25
    rng = np.random.default_rng(0)
    b_req = pd.concat([_requests(c, 40, 50, 20, 64, rng) for c in (4, 8, 16, 32, 64)])
    c_req = pd.concat([_requests(c, 40, 50, 25, 64, rng) for c in (4, 8, 16, 32, 64)])
    res = compare(cand, base, None, c_req, b_req)
    tpot = {v.concurrency: v for v in res.verdicts if v.metric == "tpot_ms_median"}
    assert all(v.status == "unconfirmed" and v.mw_source == "requests" for v in tpot.values())
    assert all(v.mw_p is not None and v.mw_p < 0.01 for v in tpot.values())  # however small the p-value
    assert all(v.noise_p is None and v.significant is None for v in tpot.values())
    assert res.overall != "regression" and any("--trials 5 (or more)" in note for note in res.notes)
    # without samples the same change cannot be confirmed, so it does not fail the gate
    res2 = compare(cand, base, None)
    assert {v.status for v in res2.verdicts if v.metric == "tpot_ms_median"} == {"unconfirmed"}


def test_repeated_trials_use_mann_whitney_on_trials():
    rng = np.random.default_rng(1)
    rows = []
    for run_id, scale in ((1, 1.0), (2, 1.0), (3, 1.0), (4, 0.88)):
        for trial in range(3):
            rows.append({"run_id": run_id, "concurrency": 8, "trial": trial,
                         "tput_per_gpu": 1000 * scale * rng.normal(1, 0.01),
                         "interactivity_median": 40 * rng.normal(1, 0.01)})
    df = pd.DataFrame(rows)
    base, cand = df[df.run_id < 4], df[df.run_id == 4]
    res = compare(cand, base, base)
    v = next(v for v in res.verdicts if v.metric == "tput_per_gpu")
    assert v.status == "regression" and v.mw_source == "trials" and v.mw_p < 0.01


def test_frame_helper_matches_fixture_docs():
    fx = load_fixture("drop10")
    df = frame(fx["runs"])
    assert len(df) == 6 * 5
    assert df.loc[(df.run_id == 6) & (df.concurrency == 16), "tput_per_gpu"].item() == \
        fx["runs"][5]["points"][2]["tput_per_gpu"]


def test_committed_fixtures_are_what_the_generator_makes():
    import importlib.util

    from analysis_data import FIXTURES

    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, scenario in mod.scenarios().items():
        assert load_fixture(name) == json.loads(json.dumps(scenario)), name


# A sweep whose level 32 sits within 1% of level 16's throughput: it is on the Pareto set at 1005 tok/s/GPU
# and off it (dominated by level 16's 1000 at higher interactivity) at 995.
_SWEEP = {4: (60.0, 400.0), 8: (50.0, 700.0), 16: (40.0, 1000.0), 32: (25.0, 1005.0), 64: (12.0, 2000.0)}


def _sweep_frame(run_ids, scale=1.0, level32=1005.0):
    rows = []
    for rid, s in zip(run_ids, np.broadcast_to(scale, len(run_ids)), strict=True):
        for conc, (inter, tput) in _SWEEP.items():
            tput = level32 if conc == 32 else tput
            rows.append({"run_id": rid, "concurrency": conc, "trial": 0, "interactivity_median": inter,
                         "tput_per_gpu": tput * s})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(("base32", "cand32"), [(1005.0, 995.0), (995.0, 1005.0)])
def test_level_slipping_on_or_off_the_pareto_set_by_one_percent_does_not_move_the_frontier(base32, cand32):
    # History of four baseline runs a few tenths of a percent apart, so the noise test applies.
    hist = _sweep_frame([1, 2, 3, 4], scale=[1.0, 0.996, 1.004, 1.002], level32=base32)
    cand = _sweep_frame([5], level32=cand32)
    res = compare(cand, hist, hist)
    assert abs(res.frontier.comparison.shift) < 0.011
    assert res.frontier.status != "regression" and res.frontier.status != "improvement"
    assert res.overall == "unchanged"


def test_curve_ten_percent_lower_with_the_same_flip_is_a_frontier_regression():
    hist = _sweep_frame([1, 2, 3, 4], scale=[1.0, 0.996, 1.004, 1.002], level32=1005.0)
    cand = _sweep_frame([5], scale=0.9, level32=995.0)
    res = compare(cand, hist, hist)
    assert res.frontier.comparison.shift == pytest.approx(-0.10, abs=0.01)
    assert res.frontier.status == "regression" and res.overall == "regression"


def test_cost_is_judged_on_each_requests_time_per_output_token():
    """$/Mtok rises when requests take longer per output token: its sample moves the same way."""
    import pandas as pd

    from k2bench.harness.analysis.regress import request_samples
    from k2bench.harness.measure.catalogue import BY_COLUMN

    reqs = pd.DataFrame({"concurrency": [4, 4, 4, 8], "success": [True, True, False, True],
                         "output_tokens": [100, 50, 100, 10], "e2el_ms": [1000.0, 1000.0, 5.0, 1.0]})
    rule = BY_COLUMN["usd_per_mtok"].sample
    assert list(request_samples(reqs, 4, rule)) == [10.0, 20.0]  # failed requests and other levels left out
    assert BY_COLUMN["usd_per_mtok"].higher_is_better is False


def test_energy_per_token_is_gated_where_measured_and_left_out_where_not():
    """J/token on a history with 1% noise: a 15% rise is a regression (judged on history, no request
    sample); on runs without GPU telemetry there is no J/token verdict at all, not a 'missing' one."""
    hist, cand, _ = fixture_frames("noise2")
    res = compare(cand, hist, hist)
    assert not any(v.metric == "j_per_token" for v in res.verdicts)
    rng = np.random.default_rng(3)
    hist, cand = hist.copy(), cand.copy()
    hist["j_per_token"] = 0.5 * (1 + 0.01 * rng.standard_normal(len(hist)))
    cand["j_per_token"] = 0.5 * 1.15 * (1 + 0.01 * rng.standard_normal(len(cand)))
    res = compare(cand, hist, hist)
    energy = [v for v in res.verdicts if v.metric == "j_per_token"]
    assert energy and all(v.status == "regression" for v in energy)
    assert all(v.mw_source != "requests" for v in energy)
