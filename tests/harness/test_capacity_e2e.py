"""`k2bench capacity` against the test server's load model, whose capacity is computed here by hand."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest

from k2bench.harness.cli import main
from k2bench.harness.load.selfmeasure import TICK_S
from k2bench.harness.servers import launch
from k2bench.harness.store import Store

# The load model (harness/load/testserver.py): with C requests in flight and no --max-running cap, every
# gap is (ITL + SLOPE x C) x slower, so a closed loop's TPOT is that too.
TTFT, ITL, SLOPE, OSL = 5.0, 2.0, 2.0, 16
TPOT_BOUND = 43.0  # half a step above C = 20: a 20-request loop has TPOT 42 ms, a 21-request loop 44 ms


def hand_capacity(bound: float, slower: float = 1.0) -> int:
    """The largest C with (ITL + SLOPE x C) x slower <= bound."""
    return math.floor((bound / slower - ITL) / SLOPE)


def capacity_argv(db: str, *extra: str, slower: float = 1.0) -> list[str]:
    server = f"--ttft-ms {TTFT} --itl-ms {ITL} --itl-slope-ms {SLOPE} --slower {slower}"
    return ["capacity", "--engine", "testserver", f"--server-args={server}", "--isl", "8", "--osl", str(OSL),
            "--slo", f"tpot_ms={TPOT_BOUND}", "--by", "concurrency", "--num-prompts", "2x", "--warmup", "1x",
            "--no-telemetry", "--db", db, *extra]


def stored_capacity(db: str) -> tuple[dict, list[dict]]:
    with Store.open(db, readonly=True) as store:
        (run,) = store.list_runs()
        doc = store.export_run(run["id"])
    return doc["run"]["extra"]["capacity"], doc["points"]


def test_capacity_by_concurrency_is_the_hand_computed_one(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    out = tmp_path / "run.json"
    code = main(capacity_argv(db, "--json", str(out)))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    expected = hand_capacity(TPOT_BOUND)
    assert expected == 20
    cap, points = stored_capacity(db)
    assert abs(cap["capacity"] - expected) <= 0.1 * expected
    assert len(cap["probes"]) <= 8 and cap["status"] == "bracketed"
    # each probe is a stored level of the one run, judged by its own requests
    assert sorted(p["load"] for p in cap["probes"]) == [p["concurrency"] for p in points]  # stored by level
    assert cap["below"]["attainment"] >= 0.99 and cap["above"]["attainment"] < 0.99
    assert cap["below"]["low"] <= cap["below"]["attainment"] <= cap["below"]["high"]
    # goodput at capacity: every request of the probe met the SLO, so it is the probe's throughput
    at_cap = next(p for p in points if p["concurrency"] == cap["capacity"])
    assert cap["goodput_per_gpu"] == pytest.approx(at_cap["tput_per_gpu"], rel=1e-9)
    assert f"capacity {cap['capacity']:g} requests in flight" in captured.out
    assert "probe 1/8: concurrency 4" in captured.err  # progress while probing
    assert json.loads(out.read_text())["run"]["extra"]["capacity"] == cap


@pytest.mark.parametrize(("argv", "message"), [
    (["--slo", "tpot=5"], "unknown metric 'tpot'"),
    (["--slo", "tpot_ms=-1"], "tpot_ms must be a finite number"),
    (["--target", "1.5"], "--target must be a fraction"),
    (["--max-probes", "1"], "--max-probes must be at least 2"),
    (["--isl", "0"], "--isl must be at least 1"),
])
def test_bad_input_is_a_clear_error_and_stores_nothing(tmp_path, capsys, argv: list[str], message: str) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    code = main([*capacity_argv(db), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    if (tmp_path / "k.db").exists():
        with Store.open(db, readonly=True) as store:
            assert store.list_runs() == []


def _capacity_run(tmp_path, db: str, commit: str, slower: float) -> tuple[int, list[dict]]:
    """The stored run's id, and the server's record of every stream it sent (its own stamps)."""
    server = ["--ttft-ms", str(TTFT), "--itl-ms", str(ITL), "--itl-slope-ms", str(SLOPE), "--slower", str(slower)]
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=server, log_dir=tmp_path) as s:
        argv = capacity_argv(db, "--commit", commit, "--branch", "main")
        i = argv.index("--engine")
        argv[i:i + 3] = ["--url", s.base_url]  # attached: both builds have the same configuration fingerprint
        assert main(argv) == 0
        with urllib.request.urlopen(f"{s.base_url}/stats?from=0&streams=1", timeout=30) as resp:
            streams = json.loads(resp.read())["streams"]
    with Store.open(db, readonly=True) as store:
        return store.list_runs(commit=commit)[0]["id"], streams


def level_streams(store: Store, run_id: int, conc: int, streams: list[dict]) -> list[dict]:
    """The server's records of a probe's requests, warmup included: levels run one after another, so they
    are the streams that arrived between the probe's first send and its last end (both sides stamp
    CLOCK_MONOTONIC); as many as the client sent."""
    sent = store.load_records(run_id, concurrency=conc, include_warmup=True)
    first_ns, last_ns = min(r.send_ns for r in sent), max(r.end_ns or r.send_ns for r in sent)
    mine = [s for s in streams if first_ns <= s["arrived"] * 1e9 <= last_ns]
    assert len(mine) == len(sent), (conc, len(mine), len(sent))
    return mine


def late_enough_to_miss(point: dict, mine: list[dict]) -> str | None:
    """What the records of a probe at or under the hand capacity show that can make it miss, or None.

    The server records each stream's schedule under the load model (its first and last message's due
    times) and when it really sent them. A stream's margin is how far its scheduled first-to-last span
    sits under the bound's (TPOT bound x its gaps); it can cross the bound only when its last message
    is later, against its first, by more than that: sent late (the server's record) plus stamped late
    (the client's own loop lag, stored with the level, which may miss up to one tick of a stall). A level
    judged invalid for that lag counts too."""
    def span_ms(s: dict, first: str, last: str) -> float:
        return (s[last] - s[first]) * 1e3

    margin_ms = min(TPOT_BOUND * (s["messages"] - 1) - span_ms(s, "first_due", "last_due") for s in mine)
    sent_late_ms = max(span_ms(s, "first_sent", "last_sent") - span_ms(s, "first_due", "last_due") for s in mine)
    lag_ms = ((point.get("client") or {}).get("lag_max_ms") or 0.0) + TICK_S * 1e3
    if sent_late_ms + lag_ms >= margin_ms:
        return f"sent {sent_late_ms:.1f} ms late + stamped up to {lag_ms:.1f} ms late >= margin {margin_ms:.1f} ms"
    if not point["valid"] and "event loop" in (point["invalid_reason"] or ""):
        return point["invalid_reason"]
    return None


def checked_capacity(db: str, run_id: int, streams: list[dict]) -> float:
    """The run's stored capacity, held to the hand-computed one against what the server and the client
    recorded: exactly it, unless a probe at or under it missed through lateness its records show (a busy
    machine); then below it. A probe over it never meets."""
    hand = hand_capacity(TPOT_BOUND)
    late = {}
    with Store.open(db, readonly=True) as store:
        doc = store.export_run(run_id)
        cap = doc["run"]["extra"]["capacity"]
        points = {p["concurrency"]: p for p in doc["points"]}
        for probe in cap["probes"]:
            mine = level_streams(store, run_id, probe["load"], streams)
            assert not (probe["meets"] and probe["load"] > hand), probe
            if not probe["meets"] and probe["load"] <= hand:
                why = late_enough_to_miss(points[probe["load"]], mine)
                assert why is not None, f"probe at {probe['load']:g} missed with nothing late: {probe}"
                late[probe["load"]] = why
    if late:
        assert cap["capacity"] is None or cap["capacity"] < hand, (cap["capacity"], late)
    else:
        assert cap["capacity"] == hand, cap["probes"]
    return cap["capacity"]


def test_regress_flags_a_30_percent_slower_build_and_not_an_a_a_rerun(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    base, base_streams = _capacity_run(tmp_path, db, "a" * 40, 1.0)
    rerun, _ = _capacity_run(tmp_path, db, "b" * 40, 1.0)
    slower, _ = _capacity_run(tmp_path, db, "c" * 40, 1.3)
    capsys.readouterr()
    assert hand_capacity(TPOT_BOUND, 1.3) == 15  # (33.1 - 2) / 2: a quarter below 20
    base_capacity = checked_capacity(db, base, base_streams)  # 20, unless the records show a busy machine

    def regress(cand: int) -> tuple[int, dict]:
        code = main(["regress", "--candidate", str(cand), "--baseline", str(base), "--format", "json",
                     "--fail-on-regression", "--db", db])
        return code, json.loads(capsys.readouterr().out)

    code, doc = regress(slower)
    cap = doc["capacity"]
    assert (cap["status"], code, doc["overall"]) == ("regression", 1, "regression"), cap
    assert cap["baseline"] == base_capacity and abs(cap["candidate"] - 15) <= 1.5
    assert "the candidate missed at" in cap["evidence"]

    code, doc = regress(rerun)
    assert doc["capacity"]["status"] == "unchanged" and code == 0, doc["capacity"]
    assert doc["overall"] != "regression"

    main(["regress", "--candidate", str(slower), "--baseline", str(base), "--db", db])
    md = capsys.readouterr().out
    assert f"Capacity (highest load with at least 99% of requests meeting the SLO): capacity {base_capacity:g} ->" in md


def test_an_unreachable_server_is_a_clear_error_and_stores_no_run(tmp_path, capsys) -> None:
    from k2bench.net import free_port

    db = f"sqlite:///{tmp_path}/k.db"
    code = main(["capacity", "--url", f"http://127.0.0.1:{free_port()}", "--slo", "tpot_ms=5", "--isl", "8",
                 "--osl", "4", "--no-telemetry", "--db", db])
    err = capsys.readouterr().err
    assert code == 3 and "cannot reach the server" in err and "Traceback" not in err
    with Store.open(db, readonly=True) as store:
        assert store.list_runs() == []


# By rate: the load model's cap. With --max-running K every request holds a slot for S = TTFT + (OSL - 1) x
# ITL (no slopes), so K slots turn over at most K / S times a second. Below that rate nearly regular
# arrivals (gamma gaps of shape 100: a coefficient of variation of 0.1) find a free slot and TTFT is the
# model's; above it the queue, and so every later request's TTFT, grows without bound, and a probe misses
# a TTFT bound of TTFT + 100 ms. The capacity is therefore K / S.
RATE_K, RATE_TTFT, RATE_ITL = 8, 40.0, 22.0


def hand_rate_capacity() -> float:
    service_s = (RATE_TTFT + (OSL - 1) * RATE_ITL) / 1000
    return RATE_K / service_s


def test_capacity_by_rate_is_the_hand_computed_one(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    server = f"--ttft-ms {RATE_TTFT} --itl-ms {RATE_ITL} --max-running {RATE_K}"
    code = main(["capacity", "--engine", "testserver", f"--server-args={server}", "--isl", "8", "--osl", str(OSL),
                 "--slo", f"ttft_ms={RATE_TTFT + 100}", "--by", "rate", "--start", "8", "--tolerance", "0.05",
                 "--burstiness", "100", "--num-prompts", "3x", "--warmup", "1x", "--no-telemetry", "--db", db])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    expected = hand_rate_capacity()
    assert round(expected, 2) == 21.62
    cap, points = stored_capacity(db)
    assert cap["by"] == "rate" and cap["status"] == "bracketed"
    assert abs(cap["capacity"] - expected) <= 0.1 * expected, cap["probes"]
    assert len(cap["probes"]) <= 8
    assert sorted(p["load"] for p in cap["probes"]) == sorted(p["rate"] for p in points)
    assert f"capacity {cap['capacity']:g} requests/s" in captured.out
