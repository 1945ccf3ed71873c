"""The reproducible record: secrets never stored, and `show --repro` re-runs the measurement (the masking
rules themselves: test_redact.py)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from k2bench.harness.cli import main
from k2bench.harness.record import repro
from k2bench.harness.store import Store


def test_the_run_stores_its_record_without_secrets(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf-secret-value")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    db = f"sqlite:///{tmp_path}/k.db"
    code = main(["sweep", "--engine", "testserver", "--server-args", "--ttft-ms 5 --itl-ms 1 --api-key s3cret",
                 "--api-key", "s3cret", "--isl", "8", "--osl", "4", "--conc", "2", "--num-prompts", "2",
                 "--warmup", "0", "--db", db, "--json", "run.json"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    text = (tmp_path / "run.json").read_text()
    assert "s3cret" not in text and "hf-secret-value" not in text
    rep = json.loads(text)["run"]["extra"]["repro"]
    assert rep["command"][:2] == ["k2bench", "sweep"] and "--api-key" in rep["command"]
    assert rep["server_env"]["HF_TOKEN"] == "***" and rep["server_env"]["OMP_NUM_THREADS"] == "2"
    assert "--api-key '***'" in rep["server_command"] and "--api-key '***'" in json.loads(text)["run"]["server_command"]
    assert json.loads(text)["run"]["engine_flags"][-2:] == ["--api-key", "***"]
    assert rep["workload"]["isl"] == 8 and rep["workload"]["seed"] == 0 and "1009" in rep["seeds"]
    assert rep["versions"]["python"] == sys.version.split()[0]
    assert main(["show", "1", "--repro", "--db", db]) == 0
    script = capsys.readouterr().out
    assert "# export HF_TOKEN=...   (a secret: set it yourself)" in script
    assert "export OMP_NUM_THREADS=2" in script and "--json" not in script.splitlines()[-1]
    assert "*** marks a secret" in script


@pytest.mark.slow
def test_show_repro_rerun_in_a_clean_shell_reproduces_the_levels(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path}/k.db"
    code = main(["sweep", "--engine", "testserver", "--server-args", "--ttft-ms 100 --itl-ms 20",
                 "--isl", "16", "--osl", "8", "--conc", "1,2", "--num-prompts", "4", "--warmup", "1",
                 "--db", db, "--json", "first.json"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["show", "1", "--repro", "--db", db]) == 0
    script = capsys.readouterr().out
    bin_dir = Path(sys.executable).parent
    clean = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}  # nothing else of this session's env
    out = subprocess.run(["bash", "-euc", script], cwd=tmp_path, env=clean, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    with Store.open(db, readonly=True) as store:
        runs = {r["id"]: r for r in store.list_runs()}
        assert set(runs) == {1, 2} and runs[2]["fingerprint"] == runs[1]["fingerprint"]
        pts = store.points_frame(run_ids=[1, 2])
    first = pts[pts["run_id"] == 1].set_index("concurrency")
    again = pts[pts["run_id"] == 2].set_index("concurrency")
    assert list(again.index) == [1, 2]
    for column in ("ttft_ms_median", "tpot_ms_median"):  # the test server's timing, within noise
        for conc in (1, 2):
            assert again.loc[conc, column] == pytest.approx(first.loc[conc, column], rel=0.25), (column, conc)


def test_show_repro_is_shell_safe_whatever_the_stored_fields_hold(tmp_path) -> None:
    """Stored strings (an imported or tampered record) land in comments or quoted words, never as a line
    bash runs: piping the script to bash creates none of the files the fields ask for."""
    def evil(n: int) -> str:
        return f"x\ntouch {tmp_path}/pwned{n}\r\ntouch {tmp_path}/pwned{n}b #"

    run = {"id": 7, "status": evil(1), "started_at": evil(2), "commit": evil(3), "branch": evil(4),
           "hardware": evil(5), "extra": {"git_dirty": True, "repro": {
               "versions": {"python": evil(6)}, "gpus": [{"name": evil(7)}],
               "workload": {"name": evil(8), "isl": evil(9)}, "seeds": evil(10), "server_command": evil(11),
               "server_env": {f"X=1;touch {tmp_path}/pwned12;Y": "v", "OK": f"$(touch {tmp_path}/pwned13)",
                              "HF_TOKEN": "***"},
               "command": [f"touch {tmp_path}/pwned14;", "sweep", "--notes", evil(15), "--json", "f"]}}}
    text = repro.script(run, 1)
    command = text[text.index("\nk2bench ") + 1:]  # the stored first word is not run, --json left out
    assert shlex.split(command) == ["k2bench", "sweep", "--notes", evil(15)]
    # k2bench itself stubbed out: what runs is the script's own lines
    out = subprocess.run(["bash", "-c", "k2bench() { :; }\n" + text], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert "# (an environment entry whose name is not a shell variable name, left out:" in text
    run["extra"]["repro"].pop("server_command")
    run["extra"]["repro"]["base_url"] = evil(16)
    subprocess.run(["bash", "-c", "k2bench() { :; }\n" + repro.script(run, 1)], cwd=tmp_path, check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_show_repro_masks_a_record_stored_before_secrets_were_masked() -> None:
    run = {"id": 3, "status": "complete", "started_at": "2026-11-01", "commit": None, "hardware": "cpu",
           "extra": {"repro": {
               "versions": {}, "gpus": [], "workload": {"name": "w"}, "seeds": "",
               "base_url": "http://u:OldUrlPw@h:8000", "server_command": None,
               "server_env": {"MY_DB_PASS": "OldEnvPw", "K2BENCH_DB": "postgresql://u:OldDbPw@h/d", "PWD": "/home/x"},
               "command": ["k2bench", "sweep", "--url", "http://u:OldUrlPw@h:8000", "--api-key", "OldKey",
                           "--notes", "x?token=OldTok"]}}}
    text = repro.script(run, 1)
    for old in ("OldUrlPw", "OldEnvPw", "OldDbPw", "OldKey", "OldTok"):
        assert old not in text
    assert "# export MY_DB_PASS=...   (a secret: set it yourself)" in text and "export PWD=/home/x" in text
    assert "# export K2BENCH_DB=postgresql://u:***@h/d   (put the masked secret back" in text
    assert "the server at http://u:***@h:8000 was started outside k2bench" in text
