"""SLO attainment and goodput end to end against the test server, whose slow requests are known: every
k-th request it receives (by arrival) starts ``--slow-ms`` late, so the share that meets a TTFT bound is
counted from what the server did, not from the client's own measurement."""

from __future__ import annotations

import contextlib
import json
import urllib.request

import pytest

from k2bench.harness.cli import main
from k2bench.harness.run.sweep import SweepConfig, run_sweep
from k2bench.harness.servers import launch
from k2bench.harness.store import Store
from k2bench.workloads.loader import Workload

FAST_MS, SLOW_MS, BOUND_MS = 20, 1500, 600  # a fast request is far under the bound, a slow one far over


@contextlib.contextmanager
def serving(tmp_path, *args: str):
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=list(args), log_dir=tmp_path) as s:
        yield s.base_url


def _server_streams(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/stats?streams=1") as resp:
        return json.loads(resp.read())["streams"]


def _sweep(tmp_path, url: str, db: str, *, slo: str | None, trials: int = 1, n: int = 20) -> int:
    cfg = SweepConfig(levels=[2], workload=Workload(name="w", isl=8, osl=4), url=url, num_prompts=n, warmup=0,
                      trials=trials, db=db, gpus=2, slo=slo, commit="c" * 40)
    result = run_sweep(cfg)
    assert result.status == "complete", result.problem
    return result.run_id


def test_attainment_of_known_slow_requests(tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", str(FAST_MS), "--itl-ms", "2", "--slow-every", "4",
                 "--slow-ms", str(SLOW_MS)) as url:
        run_id = _sweep(tmp_path, url, db, slo=f"tpot_ms=1000,ttft_ms={BOUND_MS}")
        streams = _server_streams(url)
    # the truth: which streams the server held back, by its own stamps
    assert len(streams) == 20
    slow = [s for s in streams if (s["first_sent"] - s["arrived"]) * 1e3 >= SLOW_MS]
    assert len(slow) == 5 == sum(1 for s in streams if s["number"] % 4 == 0)
    with Store.open(db, readonly=True) as store:
        run = store.get_run(run_id)
        point = store.export_run(run_id)["points"][0]
    assert run["slo"] == f"ttft_ms={BOUND_MS},tpot_ms=1000"  # canonical order
    assert point["slo_met"] == 15 and point["slo_attainment"] == pytest.approx(15 / 20)
    assert point["slo_attainment_low"] < 0.75 < point["slo_attainment_high"]
    assert point["goodput_rps"] == pytest.approx(15 / point["duration_s"])
    # every request asked for 8 input and 4 output tokens; 2 GPUs
    assert point["goodput_per_gpu"] == pytest.approx(15 * 12 / point["duration_s"] / 2)

    # after the fact, under another SLO: a bound above the slow requests' TTFT lets all of them through
    assert main(["show", str(run_id), "--db", db, "--slo", f"ttft_ms={FAST_MS + SLOW_MS + 2000}"]) == 0
    out = capsys.readouterr().out
    assert "100.0%" in out and "83.2-100.0" in out and "computed now from the stored requests" in out
    assert main(["show", str(run_id), "--db", db]) == 0  # stored figures, shown as stored
    out = capsys.readouterr().out
    assert "75.0%" in out and f"{100 * point['slo_attainment_low']:.1f}-" in out


@pytest.mark.parametrize("argv", [
    ["show", "1", "--slo", "ttft=5"],
    ["sweep", "--url", "http://127.0.0.1:9", "--slo", "ttft_ms=fast"],
    ["regress", "--candidate", "1", "--slo", "tpot_ms=0"],
])
def test_bad_slo_is_a_user_error(tmp_path, capsys, argv):
    code = main([*argv, "--db", f"sqlite:///{tmp_path}/none.db"])
    err = capsys.readouterr().err
    assert code == 2 and "--slo" in err and "Traceback" not in err
    assert not (tmp_path / "none.db").exists()  # refused before any store was touched


def test_suite_file_carries_the_slo():
    from k2bench.harness.plan import settings

    fields = settings.from_table({"slo": "tpot_ms=50,ttft_ms=2000"}, "suite.toml [[job]] 1")
    cfg = SweepConfig.from_settings(fields)
    assert cfg.slo == "tpot_ms=50,ttft_ms=2000"
    from k2bench.errors import UserError

    with pytest.raises(UserError, match="suite.toml.*known: ttft_ms"):
        settings.from_table({"slo": "p99=3"}, "suite.toml [[job]] 1")


def test_regress_judges_both_sides_under_the_candidates_slo(tmp_path):
    """The baseline was swept without an SLO: the gate recomputes its attainment from its requests and flags
    the candidate, whose server holds back every other request, as a regression (5 trials each side)."""
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", str(FAST_MS), "--itl-ms", "2") as url:
        base = _sweep(tmp_path, url, db, slo=None, trials=5, n=8)
    with serving(tmp_path, "--ttft-ms", str(FAST_MS), "--itl-ms", "2", "--slow-every", "2",
                 "--slow-ms", str(SLOW_MS)) as url:
        cand = _sweep(tmp_path, url, db, slo=f"ttft_ms={BOUND_MS}", trials=5, n=8)
    out = tmp_path / "verdict.json"
    code = main(["regress", "--candidate", str(cand), "--baseline", str(base), "--db", db, "--format", "json",
                 "--out", str(out), "--fail-on-regression"])
    assert code == 1
    doc = json.loads(out.read_text())
    att = next(v for v in doc["verdicts"] if v["metric"] == "slo_attainment")
    assert (att["baseline"], att["candidate"]) == (1.0, 0.5)
    assert att["status"] == "regression" and att["mw_source"] == "trials"
    assert any(f"ttft_ms={BOUND_MS}" in note for note in doc["notes"])
