"""`k2bench sweep --eval`: the evaluation runs on the swept server and is stored with the run."""

from __future__ import annotations

import json
import shutil

import pytest

from k2bench.harness.cli import main
from k2bench.harness.commands.sweep import parse_evals


def test_eval_flags_are_parsed_and_checked(capsys):
    assert parse_evals(["tiny-arith", "gsm8k@64"]) == [("tiny-arith", None), ("gsm8k", 64)]
    assert main(["sweep", "--url", "http://127.0.0.1:9", "--eval", "tiny-arith@0"]) == 2
    assert main(["sweep", "--url", "http://127.0.0.1:9", "--eval", "nope"]) == 2
    err = capsys.readouterr().err
    assert "TASK@CONC" in err and "unknown eval task 'nope'" in err


@pytest.mark.engine
@pytest.mark.slow
def test_sweep_stores_the_eval_of_the_bundled_engine(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("lm_eval")
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path}/k.db"
    code = main(["sweep", "--isl", "32", "--osl", "8", "--conc", "2", "--num-prompts", "4", "--warmup", "1",
                 "--eval", "tiny-arith@4", "--eval-limit", "20", "--db", db, "--json", "run.json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads((tmp_path / "run.json").read_text())
    (ev,) = doc["evals"]
    assert (ev["task"], ev["metric"], ev["n"], ev["concurrency"], len(ev["items"])) == \
        ("tiny-arith", "exact_match", 20, 4, 20)
    assert ev["value"] == pytest.approx(sum(ev["items"]) / 20)
    assert "eval tiny-arith: exact_match" in captured.out
    shutil.rmtree(tmp_path / "results", ignore_errors=True)
