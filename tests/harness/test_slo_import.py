"""Goodput of an imported vLLM result equals vLLM's own figure for the same SLO.

The fixture (fixtures/vllm_detailed_goodput.json) is a `vllm bench serve --save-result --save-detailed
--goodput ttft:100 tpot:20` file written by hand. Its request_goodput was worked out by hand from vLLM's
rule (vllm/benchmarks/serve.py, calculate_metrics): only successful requests, TPOT =
(latency - ttft) / (output_len - 1) and 0 for one output token, good when every value <= its bound,
goodput = good / duration:

    request  ttft   TPOT                    e2el    good under ttft<=100, tpot<=20
    0        50     30/3 = 10               80      yes
    1        150    10                      180     no (ttft)
    2        80     90/3 = 30               170     no (tpot)
    3        100    45/3 = 15               145     yes (ttft on the bound: bounds are inclusive)
    4        90     0 (one token)           90      yes
    5        failed                                 not counted
    6        60     38/2 = 19               98      yes
    7        70     70/4 = 17.5             140     yes
    -> 5 good / 2.5 s = 2.0 req/s (the file's request_goodput)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2bench.harness.cli import main
from k2bench.harness.store import Store

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_detailed_goodput.json"


@pytest.fixture
def imported(tmp_path, capsys) -> tuple[str, int]:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    assert main(["import", "--from", "vllm", str(FIXTURE), "--db", db]) == 0
    capsys.readouterr()
    return db, 1


def _point(db: str, run_id: int, slo: str) -> dict:
    from k2bench.harness.analysis.slo_view import level_figures
    from k2bench.harness.measure.slo import parse_slo

    with Store.open(db, readonly=True) as store:
        run = store.get_run(run_id)
        point = store.export_run(run_id)["points"][0]
        return {**point, **level_figures(store, run_id, point, run["num_gpus"], parse_slo(slo))}


def test_goodput_equals_vllms_own(imported):
    db, run_id = imported
    p = _point(db, run_id, "ttft_ms=100,tpot_ms=20")
    vllm = json.loads(FIXTURE.read_text())
    assert p["goodput_rps"] == pytest.approx(vllm["request_goodput"], rel=1e-12)
    assert p["extra"]["request_goodput"] == vllm["request_goodput"]
    # attainment counts the failed request as not good: 5 of 8
    assert (p["slo_met"], p["slo_attainment"]) == (5, 5 / 8)
    # good requests' tokens: 5 x 32 input + (4 + 4 + 1 + 3 + 5) output over 2.5 s on 2 GPUs
    assert p["goodput_per_gpu"] == pytest.approx((5 * 32 + 17) / 2.5 / 2)


def test_other_slos_by_hand(imported):
    db, run_id = imported
    assert _point(db, run_id, "e2el_ms=100")["slo_met"] == 3  # requests 0, 4, 6
    # request 7's gaps 10, 40, 10, 10 ms: p99 = 40 - 0.03 x 30 = 39.1 ms (linear), the others' under 31
    assert _point(db, run_id, "itl_p99_ms=35")["slo_met"] == 6  # every success but 7
    assert _point(db, run_id, "itl_p99_ms=39.2")["slo_met"] == 7


def test_show_prints_the_imported_runs_attainment(imported, capsys):
    db, run_id = imported
    assert main(["show", str(run_id), "--db", db, "--slo", "ttft_ms=100,tpot_ms=20"]) == 0
    out = capsys.readouterr().out
    assert "62.5%" in out and "2.00" in out


def test_summary_without_requests_gets_no_figures(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'k.db'}"
    plain = Path(__file__).parents[1] / "fleet" / "fixtures" / "vllm-inf-concurrency4-Qwen3-0.6B.json"
    assert main(["import", "--from", "vllm", str(plain), "--db", db]) == 0
    assert main(["show", "1", "--db", db, "--slo", "ttft_ms=100"]) == 0
    assert "no SLO figures: no requests stored" in capsys.readouterr().out
