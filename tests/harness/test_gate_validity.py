"""A gate that does not cry wolf (issue 12): invalid levels are reported as invalid and never gate,
one run's per-request samples never confirm a change alone, a commit's own runs are its baseline, and
a run already stored is not imported twice."""

from __future__ import annotations

import contextlib
import json

from k2bench.harness.cli import main
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.servers import launch
from k2bench.harness.store import Store

MS = 1_000_000


def _records(conc: int, gap_ms: float, seed: int, n: int | None = None, tokens: int = 16) -> list[RequestRecord]:
    """Closed-loop-shaped records: TTFT 50 ms, then a token every ``gap_ms`` (a little jitter per seed)."""
    n = n or 4 * conc
    out = []
    for i in range(n):
        send = 10**12 + seed * 10**10 + (i // conc) * int((60 + tokens * gap_ms) * MS)
        jitter = ((i * 7919 + seed * 104729) % 1000) * 200  # up to 0.2 ms, deterministic
        stamps = [send + 50 * MS + int(j * gap_ms * MS) + jitter for j in range(tokens)]
        out.append(RequestRecord(index=i, concurrency=conc, warmup=False, requested_input_tokens=64,
                                 requested_output_tokens=tokens, send_ns=send, token_ns=stamps,
                                 end_ns=stamps[-1] + 100_000, prompt_tokens=64, output_tokens=tokens,
                                 success=True))
    return out


def _store_run(db: str, commit: str, branch: str, levels: dict[int, tuple[float, bool]], seed: int) -> int:
    """A run whose levels have the given per-token gap and validity."""
    meta = {"commit": commit, "branch": branch, "engine": "testserver", "model": "m", "hardware": "cpu: test",
            "num_gpus": 1, "tp": 1, "workload": "w", "isl": 64, "osl": 16, "range_ratio": 1.0}
    with Store.open(db) as store:
        run_id = store.create_run(meta)
        for conc, (gap, valid) in levels.items():
            recs = _records(conc, gap, seed)
            point = summarize_level(recs, concurrency=conc, num_gpus=1)
            point["valid"], point["invalid_reason"] = valid, None if valid else "12 of 256 requests failed"
            store.add_point(run_id, point, recs)
        store.finish_run(run_id, "complete")
    return run_id


def _history(db: str) -> None:
    for seed in range(3):
        _store_run(db, f"aaaa{seed}", "main", {64: (5.0, True), 128: (8.0, True)}, seed)


def test_an_invalid_level_is_reported_invalid_and_a_real_slowdown_still_gates(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    _history(db)
    _store_run(db, "cccc1", "pr", {64: (5.5, True), 128: (80.0, False)}, seed=7)  # 10% slower; 128 broken
    code = main(["regress", "--candidate", "cccc1", "--baseline-mode", "latest", "--fail-on-regression",
                 "--format", "json", "--db", db])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    by_level = {}
    for v in report["verdicts"]:
        by_level.setdefault(v["concurrency"], set()).add(v["status"])
    assert by_level[128] == {"invalid"}
    assert "regression" in by_level[64]


def test_a_candidate_whose_only_change_is_an_invalid_level_passes(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    _history(db)
    _store_run(db, "cccc2", "pr", {64: (5.0, True), 128: (80.0, False)}, seed=8)
    code = main(["regress", "--candidate", "cccc2", "--baseline-mode", "latest", "--fail-on-regression",
                 "--db", db])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "invalid" in out


@contextlib.contextmanager
def serving(tmp_path, *args: str):
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=list(args), log_dir=tmp_path) as s:
        yield s.base_url


def _sweep(tmp_path, db: str, itl_ms: float, commit: str, branch: str) -> None:
    with serving(tmp_path, "--ttft-ms", "20", "--itl-ms", str(itl_ms)) as url:
        code = main(["sweep", "--url", url, "--isl", "16", "--osl", "16", "--conc", "1,2", "--num-prompts", "8",
                     "--warmup", "1", "--db", db, "--commit", commit, "--branch", branch])
    assert code == 0


def test_one_run_of_machine_drift_is_unconfirmed_not_a_regression(tmp_path, capsys) -> None:
    """Two runs of one commit, the second 8% slower per token: per-request samples share their run's
    machine state, so without a noise history or trials the change is unconfirmed and the gate passes."""
    db = f"sqlite:///{tmp_path}/k.db"
    _sweep(tmp_path, db, 10.0, "d0d0", "main")
    _sweep(tmp_path, db, 10.8, "d0d0", "main")
    capsys.readouterr()
    code = main(["regress", "--candidate", "2", "--baseline", "1", "--fail-on-regression", "--db", db])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "unconfirmed" in out and "--trials" in out  # and what would confirm it
    assert "Regression" not in out


def test_the_commits_own_runs_are_its_baseline(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    _sweep(tmp_path, db, 10.0, "e0e0", "main")
    _sweep(tmp_path, db, 10.0, "e0e0", "main")
    capsys.readouterr()
    code = main(["regress", "--candidate", "2", "--baseline-mode", "latest", "--db", db])
    out = capsys.readouterr().out
    assert code == 0
    assert "no earlier main run has the same configuration" not in out
    assert "#1" in out  # run 1, same commit, is the baseline


def test_with_three_main_runs_a_30_percent_slower_pr_fails_the_gate(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    for i in range(3):
        _sweep(tmp_path, db, 10.0, f"f0f{i}", "main")
    _sweep(tmp_path, db, 13.0, "abab", "feature")
    capsys.readouterr()
    code = main(["regress", "--candidate", "abab", "--baseline-mode", "latest", "--fail-on-regression", "--db", db])
    out = capsys.readouterr().out
    assert code == 1, out


def test_importing_a_stored_run_again_is_refused_unless_forced(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    _store_run(db, "1111", "main", {4: (5.0, True)}, seed=1)
    assert main(["export", "1", "--json", str(tmp_path / "r.json"), "--db", db]) == 0
    capsys.readouterr()
    assert main(["import", str(tmp_path / "r.json"), "--db", db]) == 2
    err = capsys.readouterr().err
    assert "already stored as run 1" in err and "--allow-duplicate" in err
    assert main(["import", str(tmp_path / "r.json"), "--db", db, "--allow-duplicate"]) == 0
    with Store.open(db, readonly=True) as store:
        assert len(store.list_runs()) == 2


def test_invalid_levels_are_out_of_the_dashboards_defaults_and_change_points(tmp_path) -> None:
    from k2bench.dashboard import data
    from k2bench.harness.analysis.changepoints import history_change_points

    db = f"sqlite:///{tmp_path}/k.db"
    _store_run(db, "9999", "main", {64: (5.0, True), 128: (80.0, False)}, seed=3)
    with Store.open(db, readonly=True) as store:
        shown = data.load_points(store)
        everything = data.load_points(store, include_invalid=True)
        frame = store.points_frame()
    assert sorted(shown["concurrency"]) == [64] and sorted(everything["concurrency"]) == [64, 128]
    table = data.level_table(data.per_run_levels(everything))
    row = table[table["concurrency"] == 128].iloc[0]
    assert not row["valid"] and row["invalid_reason"] == "12 of 256 requests failed"
    # a wildly different invalid level in a long history is never a change point
    history = frame.copy()
    runs = []
    for i in range(12):
        one = history.copy()
        one["run_id"] = i + 1
        one["started_at"] = f"2026-11-{i + 1:02d}T00:00:00Z"
        if i >= 6:  # the invalid level jumps tenfold half way; the valid one stays
            one.loc[one["concurrency"] == 128, "tput_per_gpu"] *= 10
        runs.append(one)
    import pandas as pd

    rows = history_change_points(pd.concat(runs, ignore_index=True), ("tput_per_gpu",), window=12, min_size=3)
    assert rows == []
