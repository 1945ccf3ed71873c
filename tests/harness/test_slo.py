"""SLO parsing, the per-request rule and per-level attainment, checked against hand computation."""

from __future__ import annotations

import pytest
from scipy.stats import beta

from k2bench.errors import UserError
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.slo import attainment, binomial_interval, meets, parse_slo, request_values

MS = 1_000_000


def rec(ttft_ms: float, gaps_ms: list[float], *, out: int | None = None, success: bool = True,
        warmup: bool = False, isl: int = 100) -> RequestRecord:
    stamps = [int(ttft_ms * MS)]
    for g in gaps_ms:
        stamps.append(stamps[-1] + int(g * MS))
    return RequestRecord(index=0, concurrency=1, warmup=warmup, requested_input_tokens=isl,
                         requested_output_tokens=len(stamps), send_ns=0, token_ns=stamps if success else [],
                         end_ns=stamps[-1], prompt_tokens=isl, output_tokens=len(stamps) if out is None else out,
                         success=success)


def test_parse_canonical_order_and_text():
    slo = parse_slo(" tpot_ms=50 , ttft_ms=2000")
    assert slo.bounds == (("ttft_ms", 2000.0), ("tpot_ms", 50.0))
    assert slo.text == "ttft_ms=2000,tpot_ms=50"
    assert parse_slo(slo.text) == slo


@pytest.mark.parametrize("text, words", [
    ("", "name=ms"), ("ttft=2000", "known: ttft_ms, tpot_ms, e2el_ms, itl_p99_ms"), ("ttft_ms", "not name=ms"),
    ("ttft_ms=fast", "not a number"), ("ttft_ms=-1", "> 0"), ("ttft_ms=nan", "finite"),
    ("ttft_ms=1,ttft_ms=2", "twice"), ("ttft_ms=1,", "not name=ms"),
])
def test_parse_refuses_bad_text(text, words):
    with pytest.raises(UserError, match=words):
        parse_slo(text)


def test_request_values_by_hand():
    # ttft 10 ms, gaps 5, 5, 20 -> e2el 40, tpot (40-10)/3 = 10
    values = request_values(rec(10, [5, 5, 20]))
    assert values["ttft_ms"] == pytest.approx(10)
    assert values["e2el_ms"] == pytest.approx(40)
    assert values["tpot_ms"] == pytest.approx(10)
    # p99 of [5, 5, 20], linear: position 0.99*2 = 1.98 -> 5 + 0.98*15
    assert values["itl_p99_ms"] == pytest.approx(5 + 0.98 * 15)


def test_meets_is_inclusive_and_vllm_single_token_rule():
    r = rec(10, [5, 5, 20])
    assert meets(r, parse_slo("ttft_ms=10,tpot_ms=10,e2el_ms=40"))
    assert not meets(r, parse_slo("tpot_ms=9.99"))
    # one output token: vLLM counts its TPOT as 0, so a TPOT bound never fails it
    assert meets(rec(10, [], out=1), parse_slo("tpot_ms=0.001"))
    assert not meets(rec(10, [5], success=False), parse_slo("ttft_ms=1e9"))


def test_attainment_counts_failed_and_skips_warmup():
    slo = parse_slo("ttft_ms=50")
    recs = [rec(10, [1]), rec(20, [1]), rec(60, [1]), rec(10, [1], success=False), rec(999, [1], warmup=True)]
    a = attainment(recs, slo, duration_s=2.0, num_gpus=2)
    assert (a.met, a.n, a.fraction) == (2, 4, 0.5)
    assert a.goodput_rps == pytest.approx(1.0)
    # good requests: 2 x (100 input + 2 output) tokens over 2 s on 2 GPUs
    assert a.goodput_per_gpu == pytest.approx(204 / 2 / 2)
    assert a.low < 0.5 < a.high
    assert attainment([], slo, duration_s=None, num_gpus=1).fraction is None


def test_clopper_pearson_matches_beta_quantiles():
    low, high = binomial_interval(7, 20, 0.95)
    assert low == pytest.approx(beta.ppf(0.025, 7, 14))
    assert high == pytest.approx(beta.ppf(0.975, 8, 13))
    low, high = binomial_interval(20, 20, 0.95)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 20))
