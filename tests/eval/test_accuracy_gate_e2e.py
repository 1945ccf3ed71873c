"""`k2bench regress` gates accuracy next to speed: imported runs with evals, the speed unchanged.

The speed fixture noise2 (2% run-to-run noise, no real change) carries the evals: every baseline run
0.97 on tiny-arith at n = 500; the imported candidate 0.80 (fails, named) or 0.96 (passes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))
from analysis_data import load_fixture  # noqa: E402

from k2bench.harness.cli import main  # noqa: E402


def _eval(right: int, n: int = 500, task: str = "tiny-arith", items: bool = True) -> dict:
    scores = [1.0] * right + [0.0] * (n - right) if items else None
    return {"task": task, "metric": "exact_match", "value": right / n,
            "stderr": (right / n * (1 - right / n) / (n - 1)) ** 0.5, "n": n, "concurrency": 8, "items": scores}


def _files(tmp_path: Path, candidate_right: int, **eval_options) -> tuple[list[str], str]:
    fx = load_fixture("noise2")
    paths = []
    for i, doc in enumerate(fx["runs"]):
        last = i == len(fx["runs"]) - 1
        doc["evals"] = [_eval(candidate_right if last else 485, **eval_options)]
        doc["schema"] = "k2bench.run/2"
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps(doc))
        paths.append(str(path))
    return paths, fx["runs"][-1]["run"]["commit"][:12]


@pytest.mark.parametrize("right,rc", [(400, 1), (480, 0)])
def test_accuracy_drop_fails_the_gate_with_speed_unchanged(tmp_path, capsys, right, rc):
    url = f"sqlite:///{tmp_path / 'k2.db'}"
    files, cand = _files(tmp_path, right)
    assert main(["import", "--db", url, *files]) == 0
    capsys.readouterr()
    out = tmp_path / "verdict.json"
    code = main(["regress", "--candidate", cand, "--baseline-mode", "latest", "--db", url,
                 "--fail-on-regression", "--json", str(out)])
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert code == rc
    assert [v for v in doc["verdicts"] if v["status"] == "regression"] == []  # speed: no regression
    (acc,) = doc["accuracy"]
    assert acc["baseline"] == pytest.approx(0.97) and acc["n_baseline"] == 2500  # five baseline runs pooled
    if rc:
        assert doc["overall"] == "regression" and acc["status"] == "regression"
        verdict = next(line for line in text.splitlines() if "Regression" in line)
        assert "accuracy 0.800 is below the tiny-arith threshold 0.95" in verdict
        assert "| tiny-arith | 0.970 | 0.800 | 500 | 0.95 | <1e-4 | ❌ regression |" in text
    else:
        assert acc["status"] == "ok" and doc["overall"] != "regression" and acc["p_value"] > 0.05


# "imported": a task with no threshold (only the two-proportion test can fail it), and tiny-arith
@pytest.mark.parametrize("task", ["imported-qa", "tiny-arith"])
@pytest.mark.parametrize("right,rc", [(400, 1), (480, 0)])
def test_evals_without_per_item_scores_are_gated_on_value_and_n(tmp_path, capsys, task, right, rc):
    """An imported result keeps value, stderr and n but no items: the two-proportion test needs only
    the proportions and the counts, so 0.97 -> 0.80 (n = 500) fails and 0.97 -> 0.96 passes."""
    url = f"sqlite:///{tmp_path / 'k2.db'}"
    files, cand = _files(tmp_path, right, task=task, items=False)
    assert main(["import", "--db", url, *files]) == 0
    capsys.readouterr()
    out = tmp_path / "verdict.json"
    code = main(["regress", "--candidate", cand, "--baseline-mode", "latest", "--db", url,
                 "--fail-on-regression", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert code == rc
    (acc,) = doc["accuracy"]
    assert acc["n_candidate"] == 500 and acc["n_baseline"] == 2500
    assert acc["candidate"] == pytest.approx(right / 500) and acc["baseline"] == pytest.approx(0.97)
    if rc:
        assert doc["overall"] == "regression" and acc["status"] == "regression" and acc["p_value"] < 1e-6
        if task == "imported-qa":
            assert acc["threshold"] is None and acc["reason"].startswith("accuracy dropped 0.970 -> 0.800")
    else:
        assert acc["status"] == "ok" and doc["overall"] != "regression" and acc["p_value"] > 0.05


def test_show_and_export_carry_the_evals(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'k2.db'}"
    files, _ = _files(tmp_path, 400)
    assert main(["import", "--db", url, files[-1]]) == 0
    assert main(["show", "1", "--db", url]) == 0
    assert "eval tiny-arith: exact_match 0.8000 ± 0.0179 (n=500 at concurrency 8)" in capsys.readouterr().out
    out = tmp_path / "back.json"
    assert main(["export", "1", "--db", url, "--json", str(out)]) == 0
    back = json.loads(out.read_text())
    assert back["schema"] == "k2bench.run/3" and back["evals"] == [_eval(400)]


def test_version_1_documents_import_with_no_evals_and_bad_evals_are_named(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'k2.db'}"
    fx = load_fixture("noise2")
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps(fx["runs"][0]))
    assert main(["import", "--db", url, str(v1)]) == 0
    bad = dict(fx["runs"][0], schema="k2bench.run/2", evals=[dict(_eval(400), items=[1.0] * 3)])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    assert main(["import", "--db", url, str(path)]) == 2
    assert "evals[0].items: 3 scores for n = 500" in capsys.readouterr().err
