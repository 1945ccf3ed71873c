"""The reproducible record: secrets never stored, and `show --repro` re-runs the measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from k2bench.harness import repro
from k2bench.harness.cli import main
from k2bench.harness.store import Store


def test_secrets_are_masked_in_arguments_commands_and_environment() -> None:
    argv = ["sweep", "--api-key", "s3cret", "--db", "postgresql://bench:pw0rd@db.example/k2",
            "--server-args", "--hf-token=abc123 --tp 4", "--token=t0k", "--conc", "4"]
    masked = repro.mask_argv(argv)
    text = " ".join(masked)
    for secret in ("s3cret", "pw0rd", "abc123", "t0k"):
        assert secret not in text
    assert masked[:3] == ["sweep", "--api-key", "***"] and "postgresql://bench:***@db.example/k2" in masked
    assert "'--hf-token=***' --tp 4" in masked and "--token=***" in masked and masked[-2:] == ["--conc", "4"]
    env = repro.mask_env({"HF_TOKEN": "x", "OPENAI_API_KEY": "y", "OMP_NUM_THREADS": "1",
                          "K2BENCH_DB": "postgresql://u:p@h/d"})
    assert env == {"HF_TOKEN": "***", "OPENAI_API_KEY": "***", "OMP_NUM_THREADS": "1",
                   "K2BENCH_DB": "postgresql://u:***@h/d"}
    cmd = repro.mask_command("AITER_X=1 SECRET_KEY=zz python3 -m srv --api-key k9 --port 8")
    assert cmd == "AITER_X=1 SECRET_KEY='***' python3 -m srv --api-key '***' --port 8"


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
