"""Suites: expansion, stable job ids, selection, the GitHub matrix, and `suite run` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2bench.errors import UserError
from k2bench.harness.cli import main
from k2bench.harness.plan import suites
from k2bench.harness.store import Store

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "suites" / "cpu-smoke.toml"

MATRIX = """
[suite]
name = "m"
[defaults]
conc = "4..16"
hardware = "mi355x"
[[matrix]]
engine = ["vllm", "sglang"]
model = "/models/k2"
tp = [4, 8]
workload = ["8k1k", "1k1k"]
[[exclude]]
engine = "sglang"
tp = 8
[[include]]
engine = "atom"
model = "/models/k2"
tp = 4
"""


def _suite(tmp_path: Path, text: str, name: str = "s.toml") -> suites.Suite:
    path = tmp_path / name
    path.write_text(text)
    return suites.load(path)


def test_lists_expand_as_a_product_with_exclude_and_include(tmp_path) -> None:
    s = _suite(tmp_path, MATRIX)
    combos = sorted((j.get("engine"), j.get("tp"), j.get("workload")) for j in s.jobs)
    assert combos == sorted([("vllm", 4, "8k1k"), ("vllm", 4, "1k1k"), ("vllm", 8, "8k1k"), ("vllm", 8, "1k1k"),
                             ("sglang", 4, "8k1k"), ("sglang", 4, "1k1k"), ("atom", 4, None)])
    assert all(j.get("conc") == "4..16" and j.get("hardware") == "mi355x" for j in s.jobs)
    assert len({j.id for j in s.jobs}) == len(s.jobs)


def test_job_ids_survive_reordering_and_change_with_any_field(tmp_path) -> None:
    a = {j.id for j in _suite(tmp_path, MATRIX, "a.toml").jobs}
    reordered = MATRIX.replace('engine = ["vllm", "sglang"]', 'engine = ["sglang", "vllm"]') \
                      .replace("tp = [4, 8]", "tp = [8, 4]")
    assert {j.id for j in _suite(tmp_path, reordered, "b.toml").jobs} == a
    changed = {j.id for j in _suite(tmp_path, MATRIX.replace('conc = "4..16"', 'conc = "4..32"'), "c.toml").jobs}
    assert not changed & a
    assert any(i.startswith("vllm-k2-tp8-8k1k-") for i in a)


def test_only_selects_by_id_or_field(tmp_path) -> None:
    s = _suite(tmp_path, MATRIX)
    one = s.jobs[3]
    assert s.select([f"id={one.id}"]) == [one]
    assert {j.get("engine") for j in s.select(["tp=8"])} == {"vllm"}
    assert len(s.select(["engine=vllm", "engine=atom", "workload=8k1k"])) == 2
    with pytest.raises(UserError, match="no job of suite 'm' matches"):
        s.select(["tp=2"])
    with pytest.raises(UserError, match="unknown key 'gpu'"):
        s.select(["gpu=1"])
    with pytest.raises(UserError, match="expected KEY=VALUE"):
        s.select(["tp"])


@pytest.mark.parametrize(("text", "message"), [
    ("[[matrix]]\nengin = 'vllm'\n", "unknown field 'engin'"),
    ("[[matrix]]\ntp = '4'\n", "tp = '4' must be int"),
    ("[[matrix]]\ntp = []\n", "empty list"),
    ("[jobs]\n", "unknown section 'jobs'"),
    ("[suite]\nname = 'x'\n", "no \\[\\[matrix\\]\\] or \\[\\[include\\]\\]"),
    ("[[matrix]]\ntp = 1\n[[exclude]]\ntp = 1\n", "every job is excluded"),
    ("[[matrix]]\nengine = 'vllm'\nserver_cmd = 'x {port}'\n", "both engine and server_cmd"),
    ("[[matrix]\n", "cannot read suite"),
])
def test_bad_suite_files_are_user_errors(tmp_path, text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        _suite(tmp_path, text)


def test_cli_errors_are_one_line(tmp_path, capsys) -> None:
    assert main(["suite", "list", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("k2bench: error: no suite file") and err.count("\n") == 1


def test_github_matrix_has_one_entry_per_job(tmp_path, capsys) -> None:
    path = tmp_path / "s.toml"
    path.write_text(MATRIX)
    assert main(["suite", "matrix", str(path), "--format", "github"]) == 0
    matrix = json.loads(capsys.readouterr().out)
    s = suites.load(path)
    assert [e["id"] for e in matrix["include"]] == [j.id for j in s.jobs]
    assert {e["runner"] for e in matrix["include"]} == {"mi355x"}
    assert set(matrix) == {"include"}


def test_shipped_suites_expand() -> None:
    smoke = suites.load(SMOKE)
    assert len(smoke.jobs) == 3 and sum(1 for j in smoke.jobs if j.get("server_cmd")) == 1
    nightly = suites.load(ROOT / "suites" / "nightly.toml")
    assert {j.get("engine") for j in nightly.jobs} == {"bundled"}
    assert all(j.get("conc") == "4..128" for j in nightly.jobs)


@pytest.mark.slow
def test_suite_run_stores_one_tagged_run_per_job_and_resumes(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    args = ["suite", "run", str(SMOKE), "--db", db, "--log-dir", str(tmp_path / "logs"), "--commit", "c0ffee1"]
    assert main(args) == 0
    assert "3 complete" in capsys.readouterr().out
    with Store.open(db, readonly=True) as store:
        runs = store.list_runs()
    ids = {j.id for j in suites.load(SMOKE).jobs}
    assert len(runs) == 3 and all(r["status"] == "complete" and r["commit"] == "c0ffee1" for r in runs)
    assert {r["tags"]["suite_job"] for r in runs} == ids and {r["tags"]["suite"] for r in runs} == {"cpu-smoke"}
    assert all(r["levels"] == 2 for r in runs)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("skipped") == 4 and "3 skipped" in out  # three jobs and the summary line
    with Store.open(db, readonly=True) as store:
        assert len(store.list_runs()) == 3
    # another commit is measured again, and --only narrows it to one job
    one = sorted(ids)[0]
    assert main([*args[:-1], "c0ffee2", "--only", f"id={one}"]) == 0
    with Store.open(db, readonly=True) as store:
        again = store.list_runs(commit="c0ffee2")
    assert [r["tags"]["suite_job"] for r in again] == [one]


@pytest.mark.slow
def test_a_failing_job_is_reported_and_the_next_one_still_runs(tmp_path, capsys) -> None:
    path = tmp_path / "s.toml"
    path.write_text("""
[suite]
name = "mixed"
[defaults]
isl = 8
osl = 4
conc = [1]
num_prompts = 2
warmup = 0
[[include]]
server_cmd = "{python} -c 'import sys; sys.exit(7)' {port}"
[[include]]
engine = "testserver"
""")
    db = f"sqlite:///{tmp_path / 'k.db'}"
    assert main(["suite", "run", str(path), "--db", db, "--log-dir", str(tmp_path / "logs"), "--commit", "abc"]) == 1
    out = capsys.readouterr().out
    assert "exited with code 7 before it was ready" in out and "1 complete, 1 failed" in out
    with Store.open(db, readonly=True) as store:
        (run,) = store.list_runs()
    assert run["engine"] == "testserver" and run["status"] == "complete"


def test_an_entrys_gpu_hour_price_and_gpus_override_the_command_lines(tmp_path) -> None:
    from k2bench.harness.run.jobrun import job_config
    from k2bench.harness.run.sweep import SweepConfig
    from k2bench.harness.telemetry.level import TelemetryConfig
    from k2bench.workloads import loader

    s = _suite(tmp_path, MATRIX.replace('hardware = "mi355x"', 'hardware = "mi355x"\ngpu_hour_usd = [2.5, 4]'))
    base = SweepConfig(levels=[1], workload=loader.load("8k1k"),
                       telemetry=TelemetryConfig(gpu_hour_usd=9.0, gpu_ids="0,1"))
    prices = sorted({job_config(s, j, base).telemetry.gpu_hour_usd for j in s.jobs})
    assert prices == [2.5, 4]
    assert {job_config(s, j, base).telemetry.gpu_ids for j in s.jobs} == {"0,1"}  # not set in the suite
    plain = _suite(tmp_path, MATRIX, "plain.toml")
    assert {job_config(plain, j, base).telemetry.gpu_hour_usd for j in plain.jobs} == {9.0}
