"""Only valid levels count, a dead server stops the sweep at once, and the sweep says what it kept
(issue 12's "Done when" items that need no schema change, and issue 16's sweep messages)."""

from __future__ import annotations

import contextlib
import json

import pytest

from k2bench.harness.cli import main
from k2bench.harness.measure.validity import ValidityRules
from k2bench.harness.run.sweep import LevelEvents, SweepConfig, SweepResult, run_sweep
from k2bench.harness.servers import launch
from k2bench.harness.store import Store
from k2bench.workloads.loader import Workload


@contextlib.contextmanager
def serving(tmp_path, *args: str):
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=list(args), log_dir=tmp_path) as s:
        yield s.base_url


def _runs(db: str) -> list[dict]:
    with Store.open(db, readonly=True) as store:
        return store.list_runs()


def test_attached_server_killed_in_the_third_level(tmp_path, capsys) -> None:
    """The issue's scenario: SIGKILL during level 16 of 4,8,16 (request 137 of 40 + 80 + 160)."""
    db = f"sqlite:///{tmp_path}/k.db"
    out = tmp_path / "run.json"
    with serving(tmp_path, "--ttft-ms", "1", "--itl-ms", "1", "--kill-after", "136") as url:
        code = main(["sweep", "--url", url, "--isl", "64", "--osl", "64", "--conc", "4,8,16", "--warmup", "0",
                     "--gpus", "1", "--db", db, "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 3, captured.err
    assert "Traceback" not in captured.err
    assert "concurrency 16: the server is gone" in captured.err
    assert "run 1 kept as partial: 2 of 3 levels (1 more stored invalid)" in captured.err
    doc = json.loads(out.read_text())  # the JSON is written
    assert doc["run"]["status"] == "partial" and _runs(db)[0]["status"] == "partial"
    assert [p["concurrency"] for p in doc["points"]] == [4, 8, 16]
    assert [p["failed"] for p in doc["points"][:2]] == [0, 0]
    assert [p["valid"] for p in doc["points"]] == [True, True, False]
    assert "the server is gone" in doc["points"][2]["invalid_reason"]
    # level 16 stopped at once: not 144 requests fired at a dead address
    assert doc["points"][2]["num_prompts"] < 16 + 16 + 16


def _point_of(result: SweepResult, conc: int) -> dict:
    return next(p for p in result.points if p["concurrency"] == conc)


@pytest.mark.parametrize(("rate", "valid"), [(0.0, False), (0.25, True)])
def test_failures_make_a_level_invalid_unless_tolerated(tmp_path, rate: float, valid: bool) -> None:
    """Every 5th request fails: 8 of 40. Invalid by default, with its failures counted and timing kept."""
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "1", "--fail-status", "500", "--fail-every", "5") as url:
        result = run_sweep(SweepConfig(levels=[4], workload=Workload(name="w", isl=8, osl=4), url=url,
                                       num_prompts=40, warmup=0, db=db, rules=ValidityRules(max_failure_rate=rate)))
    point = _point_of(result, 4)
    with Store.open(db, readonly=True) as store:
        stored = store.export_run(result.run_id)["points"][0]
    assert (stored["valid"], stored["invalid_reason"], stored["failed"]) == (
        point["valid"], point["invalid_reason"], 8)
    assert point["failed"] == 8 and point["completed"] == 32
    assert point["ttft_ms"]["median"] is not None and point["tput_per_gpu"] > 0
    assert point["valid"] is valid
    if valid:
        assert point["invalid_reason"] is None and result.exit_code == 0
    else:
        assert point["invalid_reason"] == "8 of 40 requests failed (20% > --max-failure-rate 0)"
        assert result.exit_code == 1 and result.status == "complete"


def test_cli_exit_code_1_and_the_reason_for_an_invalid_level(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "1", "--completion-tokens-delta", "1") as url:
        code = main(["sweep", "--url", url, "--isl", "8", "--osl", "4", "--conc", "2", "--num-prompts", "4",
                     "--warmup", "0", "--db", db])
        err = capsys.readouterr().err
        assert code == 1, err
        assert "level conc 2 is invalid" in err and "4 output(s) differed from the requested length" in err
        code = main(["sweep", "--url", url, "--isl", "8", "--osl", "4", "--conc", "2", "--num-prompts", "4",
                     "--warmup", "0", "--db", db, "--allow-osl-mismatch"])
        assert code == 0, capsys.readouterr().err


def test_bad_failure_rate_is_a_usage_error(tmp_path, capsys) -> None:
    code = main(["sweep", "--url", "http://127.0.0.1:9", "--max-failure-rate", "1.5", "--db", f"sqlite:///{tmp_path}/k.db"])
    assert code == 2 and "--max-failure-rate must be at least 0 and below 1" in capsys.readouterr().err


def test_level_timeout_stops_the_level_and_marks_it_invalid(tmp_path) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "100") as url:  # each request takes ~6 s
        result = run_sweep(SweepConfig(levels=[2], workload=Workload(name="w", isl=8, osl=64), url=url,
                                       num_prompts=6, warmup=0, db=db, level_timeout_s=0.5))
    point = _point_of(result, 2)
    assert not point["valid"] and "ran longer than --level-timeout 0.5 s" in point["invalid_reason"]
    assert point["num_prompts"] == 2 and point["failed"] == 2  # the first wave, cut off; the rest never sent
    assert result.exit_code == 1


@pytest.mark.parametrize("exit_shows", ["at once", "after its connections dropped"])
def test_launched_server_death_stops_the_level_without_a_burst(tmp_path, capsys, monkeypatch, exit_shows) -> None:
    """The level stops at once and says how the server ended, also when (as on a busy machine) the client
    counts its dropped connections before the killed process's exit can be seen: the kernel closes a
    dying process's sockets before its parent may reap it."""
    if exit_shows != "at once":  # the exit stays unseen while the level runs
        monkeypatch.setattr(launch.Server, "poll", lambda self: self.exit_code)
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path}/k.db"
    code = main(["sweep", "--engine", "testserver", "--server-args", "--ttft-ms 1 --itl-ms 1 --kill-after 50",
                 "--isl", "8", "--osl", "8", "--conc", "4,8", "--warmup", "0", "--db", db, "--json", "r.json"])
    err = capsys.readouterr().err
    assert code == 3 and "Traceback" not in err
    assert "concurrency 8: the server was killed by signal 9 (SIGKILL); last lines of" in err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["run"]["status"] == "partial"
    dead = doc["points"][1]
    assert dead["concurrency"] == 8 and dead["num_prompts"] <= 10 + 2 * 8  # of 80: stopped at once


def test_prompts_outside_the_servers_vocabulary_fail_with_the_fix_and_leave_no_run(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", "1", "--itl-ms", "1", "--vocab-size", "512") as url:
        code = main(["sweep", "--url", url, "--conc", "4", "--isl", "128", "--osl", "16", "--db", db])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "token id" in err and "outside the vocabulary (0..511)" in err
    assert "pass --model <folder or id> so prompts use the server's vocabulary" in err
    assert _runs(db) == []


def _model_folder(tmp_path, vocab: int):
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": vocab, "eos_token_id": 1}))
    return folder


def test_url_takes_the_vocabulary_from_the_model_folder_the_server_reports(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    folder = _model_folder(tmp_path, 512)
    with serving(tmp_path, "--ttft-ms", "1", "--itl-ms", "1", "--vocab-size", "512", "--root", str(folder)) as url:
        code = main(["sweep", "--url", url, "--conc", "2", "--isl", "64", "--osl", "4", "--num-prompts", "4",
                     "--warmup", "1", "--db", db])
    assert code == 0, capsys.readouterr().err
    assert _runs(db)[0]["extra"]["vocabulary"] == str(folder)


def test_ctrl_c_says_what_was_kept_and_prints_the_finished_levels(tmp_path, capsys, monkeypatch) -> None:
    from k2bench.harness.commands import sweep_output

    real = sweep_output.SweepDisplay.level_done

    def interrupt_after_first(self, point: dict) -> None:
        real(self, point)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_output.SweepDisplay, "level_done", interrupt_after_first)
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", "1", "--itl-ms", "1") as url:
        code = main(["sweep", "--url", url, "--isl", "8", "--osl", "4", "--conc", "1,2,4", "--num-prompts", "2",
                     "--warmup", "0", "--db", db])
    captured = capsys.readouterr()
    assert code == 130
    assert "run 1 kept as partial: 1 of 3 levels" in captured.err
    assert "run 1 (partial)" in captured.out and "tok/s/GPU" in captured.out  # the finished level's table


def test_a_finished_sweep_says_how_to_open_the_dashboard_and_names_devices(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", "1", "--itl-ms", "1") as url:
        common = ["sweep", "--url", url, "--isl", "8", "--osl", "4", "--conc", "1,2", "--num-prompts", "2",
                  "--warmup", "0", "--db", db]
        assert main([*common, "--hardware", "cpu: test"]) == 0
        captured = capsys.readouterr()
        assert main([*common, "--hardware", "NVIDIA H200", "--gpus", "4"]) == 0
        gpu = capsys.readouterr()
    assert f"see it in the dashboard: k2bench dashboard --db {db}" in captured.err
    assert "http://127.0.0.1:8501" in captured.err
    assert "1 CPU" in captured.out and "GPU" not in captured.out.split("\n", 1)[0]
    assert "4 GPU(s)" in gpu.out
    # after the first of two levels, the time left
    assert "level 1 of 2 done; 1 to go, about" in captured.err


def test_a_bare_sweep_suggests_a_quick_one_and_the_gpu_one(tmp_path, capsys, monkeypatch) -> None:
    """Without arguments the sweep is the design card's (hours on a CPU): it says so before starting."""
    import k2bench.harness.run.sweep as sweep_mod

    started: list[SweepConfig] = []

    def fake_run(cfg: SweepConfig, events: LevelEvents) -> SweepResult:
        started.append(cfg)
        return SweepResult(run_id=None, status="failed", points=[], meta={}, planned=6, exit_code=130)

    monkeypatch.setattr(sweep_mod, "run_sweep", fake_run)
    assert main(["sweep", "--db", f"sqlite:///{tmp_path}/k.db"]) == 130
    err = " ".join(capsys.readouterr().err.split())
    assert "the design card's full sweep (8k1k, concurrency 4,8,16,32,64,128)" in err
    assert "a sweep that finishes in minutes: k2bench sweep --isl 512 --osl 64 --conc 4..16" in err
    assert "the full sweep on a GPU: k2bench sweep --engine bundled --model <checkpoint folder>" in err
    assert "no level finished; nothing was stored" in err
    assert started and started[0].levels == [4, 8, 16, 32, 64, 128]
    # with any of the levels or lengths given, no such note
    assert main(["sweep", "--conc", "4", "--db", f"sqlite:///{tmp_path}/k.db"]) == 130
    assert "design card" not in capsys.readouterr().err


def test_a_sweep_too_big_for_the_server_warns_up_front_and_goes_on(tmp_path, capsys) -> None:
    """The design card's sizes on a slow server: an estimate before the first level, then the levels."""
    db = f"sqlite:///{tmp_path}/k.db"
    # the probe: first tokens 2 s after arrival (all four of its batch at once), 5 ms steps -> 0.5 s of
    # prefill a prompt; 60 waves of 256 tokens over levels 4..128 -> about 22 min, over the 20-minute mark
    with serving(tmp_path, "--ttft-ms", "2000", "--itl-ms", "5") as url:
        code = main(["sweep", "--url", url, "--isl", "8192", "--osl", "256", "--conc", "4..128", "--warmup", "0",
                     "--level-timeout", "0.3", "--hardware", "cpu: test", "--db", db])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1  # every level stopped by --level-timeout: stored invalid
    assert "warning: this sweep will take about" in err and "it goes on" in err
    assert "a sweep that finishes in minutes: k2bench sweep --isl 512" in err
    assert "the full sweep on a GPU" in err
    assert err.index("warning: this sweep will take") < err.index("level conc 4 is invalid")
    with Store.open(db, readonly=True) as store:
        assert len(store.points_frame()) == 6  # it went on through every level


def test_a_version_1_file_imports_with_validity_from_its_failures(tmp_path, capsys) -> None:
    """Files written before validity existed keep importing: a level counts when none of its requests failed."""
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", "1", "--itl-ms", "1", "--fail-status", "500", "--fail-every", "3") as url:
        run_sweep(SweepConfig(levels=[1, 2], workload=Workload(name="w", isl=8, osl=4), url=url, num_prompts=2,
                              warmup=0, db=db, json_path=str(tmp_path / "v2.json"),
                              rules=ValidityRules(max_failure_rate=0.5)))
    doc = json.loads((tmp_path / "v2.json").read_text())
    assert doc["schema"] == "k2bench.run/3" and [p["failed"] for p in doc["points"]] == [0, 1]
    doc["schema"] = "k2bench.run/1"
    for p in doc["points"]:
        del p["valid"], p["invalid_reason"]
    (tmp_path / "v1.json").write_text(json.dumps(doc))
    assert main(["import", str(tmp_path / "v1.json"), "--db", f"sqlite:///{tmp_path}/other.db"]) == 0
    with Store.open(f"sqlite:///{tmp_path}/other.db", readonly=True) as store:
        points = store.export_run(1)["points"]
    assert [p["valid"] for p in points] == [True, False] and "failed" in points[1]["invalid_reason"]
    capsys.readouterr()
    assert main(["show", "1", "--db", f"sqlite:///{tmp_path}/other.db"]) == 0
    out = capsys.readouterr().out
    assert "INVALID" in out and "conc 2: invalid (left out of frontiers" in out
    assert main(["runs", "--db", f"sqlite:///{tmp_path}/other.db"]) == 0
    assert "2 (1 invalid)" in capsys.readouterr().out
