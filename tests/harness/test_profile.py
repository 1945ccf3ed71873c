"""--profile-level parsing, the profile a run keeps (both backends), and profile-diff against hand-computed
summaries. The bundled engine's own profiler runs in tests/engine/runtime/test_profiler_e2e.py."""

from __future__ import annotations

import json

import pytest
from store_helpers import make_level, run_meta

from k2bench.errors import UserError
from k2bench.harness.analysis import profile_diff
from k2bench.harness.cli import main
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.run.sweep import SweepConfig
from k2bench.harness.store import Store
from k2bench.harness.telemetry import profile
from k2bench.harness.telemetry.profile import ProfileLevel
from k2bench.workloads.loader import Workload


def summary(steps: int, ops: dict[str, tuple[int, float]]) -> dict:
    """A k2bench.profile/1 summary: name -> (calls, self µs over the window)."""
    return {"format": "k2bench.profile/1", "device": "cpu", "steps": steps, "window_s": 1.0, "ops_total": len(ops),
            "ops": [{"name": n, "kind": "cpu", "calls": c, "self_us": us, "total_us": us,
                     "self_us_per_step": us / steps if steps else None} for n, (c, us) in ops.items()]}


def test_profile_level_text_forms() -> None:
    assert profile.parse("4") == ProfileLevel(4, None) and profile.parse("4").requests_for() == 4
    assert profile.parse(" 16:40 ") == ProfileLevel(16, 40) and profile.parse("16:40").requests_for() == 40
    for bad in ("", "x", "4:", "4:8:2", "0:8", "4:0", "-1", "4.5"):
        with pytest.raises(UserError, match="--profile-level"):
            profile.parse(bad)


def test_profile_level_must_name_a_measured_level(tmp_path, capsys) -> None:
    cfg = SweepConfig(levels=[1, 2], workload=Workload(name="w", isl=8, osl=4), engine="testserver",
                      profile_level="4:8")
    with pytest.raises(UserError, match="concurrency 4 is not among the levels"):
        cfg.validate()
    code = main(["sweep", "--engine", "testserver", "--conc", "2", "--profile-level", "2:x",
                 "--db", f"sqlite:///{tmp_path}/k.db"])
    assert code == 2 and "--profile-level '2:x'" in capsys.readouterr().err


def test_diff_ranks_by_change_of_self_time_per_step() -> None:
    # A: 10 steps; B: 20 steps (twice the requests). Per step: mm 100 -> 100 (unchanged, though its
    # window total doubled), sample 10 -> 60, norm 30 -> 20, new_op absent -> 5, gone absent in B.
    a = summary(10, {"aten::mm": (40, 1000.0), "engine.sample": (10, 100.0), "norm": (20, 300.0),
                     "gone": (10, 20.0)})
    b = summary(20, {"aten::mm": (80, 2000.0), "engine.sample": (20, 1200.0), "norm": (40, 400.0),
                     "new_op": (20, 100.0)})
    rows = profile_diff.diff(a, b, top=None)
    assert [r.name for r in rows] == ["engine.sample", "norm", "new_op", "gone", "aten::mm"]
    top = rows[0]
    assert (top.a_us, top.b_us, top.delta_us, top.ratio) == (10.0, 60.0, 50.0, 6.0)
    assert (rows[1].delta_us, rows[2].a_us, rows[2].ratio, rows[3].b_us) == (-10.0, 0.0, None, 0.0)
    assert rows[4].delta_us == 0.0 and rows[4].a_calls == rows[4].b_calls == 4.0
    assert [r.name for r in profile_diff.diff(a, b, top=2)] == ["engine.sample", "norm"]
    table = profile_diff.markdown(rows, "good", "bad")
    assert "| `engine.sample` | cpu | 10.0 | 60.0 | +50.0 | 6.00x |" in table
    assert "| `new_op` | cpu | 0.0 | 5.0 | +5.0 | new |" in table


def test_a_profile_without_steps_is_a_user_error() -> None:
    with pytest.raises(UserError, match="no engine step"):
        profile_diff.diff(summary(0, {"a": (1, 1.0)}), summary(3, {"a": (1, 1.0)}))


def _profiled_run(store: Store, prof: dict | None) -> int:
    run_id = store.create_run(run_meta())
    point = summarize_level(make_level(2), concurrency=2, num_gpus=2)
    store.add_point(run_id, {**point, "valid": True, "invalid_reason": None}, make_level(2))
    if prof is not None:
        store.set_profile(run_id, prof)
    return run_id


def test_stored_profiles_round_trip_and_diff_on_the_command_line(db_url, tmp_path, capsys) -> None:
    a_prof = {"concurrency": 2, "requests": 4, "completed": 4, "note": profile.NOTE, "trace": "/t/a.json",
              "summary": summary(10, {"engine.sample": (10, 100.0), "aten::mm": (40, 1000.0)})}
    b_prof = {**a_prof, "trace": "/t/b.json",
              "summary": summary(10, {"engine.sample": (10, 900.0), "aten::mm": (40, 1100.0)})}
    with Store.open(db_url) as store:
        a, b = _profiled_run(store, a_prof), _profiled_run(store, b_prof)
        bare = _profiled_run(store, None)
        failed = _profiled_run(store, {"concurrency": 2, "requests": 4, "completed": 0,
                                       "error": "POST /start_profile answered HTTP 404"})
        assert store.get_run(a)["profile"] == a_prof and store.get_run(bare)["profile"] is None
        with pytest.raises(UserError, match=r"run\.profile: expected an object"):
            store.set_profile(a, ["not", "an", "object"])
        doc = store.export_run(b)
    with Store.open(f"sqlite:///{tmp_path}/copy.db") as copy:  # an exported run imports with its profile
        assert copy.get_run(copy.import_run(doc))["profile"] == b_prof
    assert doc["run"]["profile"]["summary"]["ops"][0]["name"] == "engine.sample"  # exported with the run
    assert main(["profile-diff", str(a), str(b), "--db", db_url, "--format", "md"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("| `engine.sample` | cpu | 10.0 | 90.0 | +80.0 | 9.00x |"), out
    assert out[3].startswith("| `aten::mm` | cpu | 100.0 | 110.0 | +10.0 |"), out
    assert main(["profile-diff", str(a), str(b), "--db", db_url, "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert "engine.sample" in text and "aten::mm" not in text
    assert main(["profile-diff", str(a), str(bare), "--db", db_url]) == 2
    assert f"run {bare} has no kernel-time summary: it was not profiled" in capsys.readouterr().err
    assert main(["profile-diff", str(failed), str(a), "--db", db_url]) == 2
    assert "HTTP 404" in capsys.readouterr().err
    # the report section of a verdict: both traces, then the diff
    with Store.open(db_url, readonly=True) as store:
        section = profile_diff.report_section(store.get_run(a), store.get_run(b), "baseline", "candidate")
        assert profile_diff.report_section(store.get_run(a), store.get_run(bare), "baseline", "candidate") is None
    assert "trace `/t/a.json`" in section and "trace `/t/b.json`" in section
    assert section.index("`engine.sample`") < section.index("`aten::mm`")
    json.dumps(doc)  # the stored profile stays plain JSON
    # `show` names the pass and its trace in one line, not the whole summary
    assert main(["show", str(a), "--db", db_url]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("profile")]
    assert "4 request(s) at concurrency 2, 4 completed; trace /t/a.json; summary of 2 ops/kernels over 10" in line
    assert main(["show", str(failed), "--db", db_url]) == 0
    assert "no profile: POST /start_profile answered HTTP 404" in capsys.readouterr().out


@pytest.mark.slow
def test_a_server_without_a_profiler_keeps_the_sweep_and_says_why(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    code = main(["sweep", "--engine", "testserver", "--server-args", "--ttft-ms 5 --itl-ms 2", "--isl", "8",
                 "--osl", "4", "--conc", "1,2", "--num-prompts", "4", "--warmup", "1", "--profile-level", "2:3",
                 "--db", db])
    assert code == 0, capsys.readouterr().err
    with Store.open(db, readonly=True) as store:
        (run,) = store.list_runs()
        prof = store.get_run(run["id"])["profile"]
        frame = store.points_frame(run_ids=[run["id"]])
        requests = store.load_records(run["id"], concurrency=2, include_warmup=True)
    assert (prof["concurrency"], prof["requests"], prof["completed"]) == (2, 3, 0)  # nothing sent unprofiled
    assert "POST /start_profile answered HTTP 404" in prof["error"] and "summary" not in prof
    assert sorted(frame["concurrency"]) == [1, 2] and len(requests) == 5  # the level's own 4 + 1 warmup
