"""`k2bench sweep --eval`: the evaluation runs on the swept server and is stored with the run."""

from __future__ import annotations

import json
import shutil

import pytest

from k2bench.errors import UserError
from k2bench.harness.cli import main
from k2bench.harness.commands.sweep import default_evals
from k2bench.harness.plan.settings_text import parse_evals


def test_eval_flags_are_parsed_and_checked(capsys):
    assert parse_evals(["tiny-arith", "gsm8k@64"]) == [("tiny-arith", None), ("gsm8k", 64)]
    assert main(["sweep", "--url", "http://127.0.0.1:9", "--eval", "tiny-arith@0"]) == 2
    assert main(["sweep", "--url", "http://127.0.0.1:9", "--eval", "nope"]) == 2
    err = capsys.readouterr().err
    assert "TASK@CONC" in err and "unknown eval task 'nope'" in err


def test_the_bundled_default_model_is_evaluated_unless_told_otherwise(monkeypatch):
    """The default sweep carries tiny-arith, the task its model is trained on; a server or model of the
    user's gets only the evaluations asked for; 'none' turns the default off."""
    import argparse
    import importlib.util

    def args(**kw) -> argparse.Namespace:
        base = {"eval": [], "url": None, "server_cmd": None, "model": None, "engine": None}
        return argparse.Namespace(**{**base, **kw})

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # lm-eval "installed"
    assert default_evals(args()) == default_evals(args(engine="bundled")) == [("tiny-arith", None)]
    assert default_evals(args(eval=["none"])) == []
    assert default_evals(args(eval=["gsm8k@8"])) == [("gsm8k", 8)]
    for other in ({"url": "http://h:8000"}, {"model": "/models/k2"}, {"engine": "vllm"}, {"server_cmd": "x"}):
        assert default_evals(args(**other)) == []
    with pytest.raises(UserError, match="cannot be combined"):
        default_evals(args(eval=["none", "tiny-arith"]))


def test_without_lm_eval_the_default_sweep_says_why_it_has_no_accuracy(monkeypatch, capsys):
    import argparse
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    ns = argparse.Namespace(eval=[], url=None, server_cmd=None, model=None, engine=None)
    assert default_evals(ns) == []
    assert "no accuracy for this run" in capsys.readouterr().err


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
