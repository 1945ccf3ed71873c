"""`k2bench sweep --rate` end to end against the test server: into SQLite, `show`, JSON and back."""

from __future__ import annotations

import json
import math

import pytest

from k2bench.errors import UserError
from k2bench.harness.cli import main
from k2bench.harness.load import schedule
from k2bench.harness.record import fingerprint, runjson
from k2bench.harness.run.sweep import SweepConfig
from k2bench.harness.store import Store


@pytest.fixture(scope="module")
def rate_run(tmp_path_factory):
    """One run with a closed level and two rate levels (20/s and inf, capped at 4) of the same concurrency."""
    tmp = tmp_path_factory.mktemp("rate")
    db, out = f"sqlite:///{tmp}/k.db", tmp / "run.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)  # the server log goes to ./results/logs
        code = main(["sweep", "--engine", "testserver", "--server-args", "--ttft-ms 20 --itl-ms 5", "--isl", "16",
                     "--osl", "4", "--conc", "4", "--rate", "20,inf", "--max-inflight", "4", "--num-prompts", "12",
                     "--warmup", "2", "--db", db, "--json", str(out), "--no-telemetry", "--max-send-lag", "10000",
                     "--max-rate-error", "0.9"])
    assert code == 0
    return db, json.loads(out.read_text())


def test_rate_levels_are_stored_beside_closed_ones(rate_run) -> None:
    db, doc = rate_run
    kinds = [(p["mode"], p["rate"], p["concurrency"]) for p in doc["points"]]
    assert sorted(kinds, key=str) == sorted([("closed", None, 4), ("rate", 20.0, 4), ("rate", "inf", 4)], key=str)
    assert doc["run"]["arrival"] == {"burstiness": 1.0, "max_inflight": 4, "ramp_up_s": 0.0, "duration_s": None,
                                     "seed": doc["run"]["arrival"]["seed"]}
    for p in doc["points"]:
        assert p["completed"] == 12 and p["valid"]
        if p["mode"] == "rate":
            assert p["achieved_rate"] > 0 and p["send_lag_p99_ms"] >= p["send_lag_p50_ms"] >= 0
        else:
            assert p["achieved_rate"] is None and p["send_lag_p50_ms"] is None


def test_every_request_keeps_its_intended_and_actual_send_time(rate_run) -> None:
    db, doc = rate_run
    with Store.open(db, readonly=True) as store:
        exported = store.export_run(doc["run"]["id"], include_requests=True)
        rate = [r for r in exported["requests"] if r["mode"] == "rate"]
        closed = [r for r in exported["requests"] if r["mode"] == "closed"]
    assert len(rate) == 2 * 14 and len(closed) == 14
    for r in rate:
        assert r["intended_ns"] > 0 and r["send_ns"] >= r["intended_ns"] and r["queue_ns"] >= 0
    assert all(r["intended_ns"] is None for r in closed)
    # the 20/s level was sent on its seeded schedule: intended gaps are the schedule's gaps
    seed = schedule.level_seed(exported["run"]["arrival"]["seed"], 20.0, 0)
    offsets, _ = schedule.level_schedule(20.0, 12, 2, seed=seed)
    level = sorted((r for r in rate if r["rate"] == 20.0), key=lambda r: r["index"])
    got = [(r["intended_ns"] - level[0]["intended_ns"]) / 1e9 for r in level]
    assert got == pytest.approx(offsets, abs=2e-9)
    # the inf level with a cap of 4: everything due at once, held back in the client's queue
    burst = [r for r in rate if r["rate"] == math.inf]
    assert len({r["intended_ns"] for r in burst}) == 1 and max(r["queue_ns"] for r in burst) > 0


def test_the_run_round_trips_through_json(rate_run, tmp_path) -> None:
    db, doc = rate_run
    with Store.open(db, readonly=True) as store:
        exported = store.export_run(doc["run"]["id"], include_requests=True)
    path = tmp_path / "again.json"
    runjson.write_doc(exported, path)
    assert '"rate": "inf"' in path.read_text()
    with Store.open(f"sqlite:///{tmp_path}/b.db") as other:
        new_id = other.import_run(runjson.load_doc(path))
        again = other.export_run(new_id, include_requests=True)
    assert [(p["mode"], p["rate"]) for p in again["points"]] == [(p["mode"], p["rate"]) for p in exported["points"]]
    assert [(r["intended_ns"], r["queue_ns"]) for r in again["requests"]] == \
        [(r["intended_ns"], r["queue_ns"]) for r in exported["requests"]]


def test_show_tells_the_level_kinds_apart(rate_run, capsys) -> None:
    db, doc = rate_run
    assert main(["show", str(doc["run"]["id"]), "--db", db]) == 0
    out = capsys.readouterr().out
    assert "c4" in out and "r20/s" in out and "r inf" in out and "lag p99" in out


def test_the_arrival_schedule_is_fingerprinted_and_closed_runs_keep_theirs() -> None:
    closed = {"engine": "e", "model": "m", "num_gpus": 1}
    assert fingerprint.fingerprint(closed) == fingerprint.fingerprint({**closed, "arrival": None})
    a = fingerprint.fingerprint({**closed, "arrival": {"burstiness": 1.0}})
    assert a != fingerprint.fingerprint(closed) and a != fingerprint.fingerprint({**closed, "arrival": {"burstiness": 2.0}})


@pytest.mark.parametrize("argv, message", [
    (["--rate", "0"], "positive"), (["--rate", "fast"], "not a number"), (["--rate", "2,2"], "twice"),
    (["--rate", "2", "--burstiness", "0"], "--burstiness must be a positive number"),
    (["--rate", "inf"], "--num-prompts"), (["--burstiness", "2"], "add --rate"),
    (["--rate", "2", "--ramp-up", "-1"], "--ramp-up must be 0 or more"),
])
def test_bad_rate_settings_are_user_errors(argv, message) -> None:
    from k2bench.harness.plan import settings

    parser = _sweep_parser()
    with pytest.raises(UserError, match=message):
        SweepConfig.from_settings(settings.from_args(parser.parse_args(["sweep", *argv]), settings.SWEEP))


def _sweep_parser():
    from k2bench.harness.cli import build_parser

    return build_parser()


def test_rate_alone_runs_only_rate_levels_and_with_conc_both() -> None:
    from k2bench.harness.plan import settings

    parser = _sweep_parser()
    alone = SweepConfig.from_settings(settings.from_args(parser.parse_args(["sweep", "--rate", "2,4"]), "sweep"))
    assert alone.levels == [] and alone.rates == [2.0, 4.0]
    assert alone.rate_count(2.0) == 20 and alone.rate_count(2.0, warmup=True) == 4  # 10 s and 2 s worth
    both = SweepConfig.from_settings(settings.from_args(parser.parse_args(["sweep", "--rate", "2", "--conc", "8"]),
                                                        "sweep"))
    assert both.levels == [8] and both.rates == [2.0]
