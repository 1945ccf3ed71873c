"""`k2bench eval` end to end through lm-evaluation-harness, against servers whose answers are known."""

from __future__ import annotations

import json
import zlib

import pytest
from servers import AnswerServer, adder, random_digits

from k2bench.harness.cli import main

pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow


@pytest.fixture
def serve():
    started: list[AnswerServer] = []

    def start(answer) -> AnswerServer:
        started.append(AnswerServer(answer))
        return started[-1]

    yield start
    for s in started:
        s.close()


def test_random_tokens_score_near_zero_and_fail_min_accuracy(serve, tmp_path, capsys):
    server = serve(random_digits(seed=1))
    out = tmp_path / "eval.json"
    rc = main(["eval", "--url", server.url, "--task", "tiny-arith", "--limit", "200", "--concurrency", "4",
               "--json", str(out), "--min-accuracy", "0.9"])
    assert rc == 1
    doc = json.loads(out.read_text())
    assert doc["schema"] == "k2bench.eval/1" and doc["task"] == "tiny-arith" and doc["metric"] == "exact_match"
    assert doc["n"] == 200 and len(doc["items"]) == 200 and doc["model"] == "fake" and doc["server"] == server.url
    assert doc["value"] < 0.05 and doc["value"] == pytest.approx(sum(doc["items"]) / 200)
    assert "below --min-accuracy 0.9" in capsys.readouterr().out
    assert len(server.prompts) == 200 and all(p.endswith("=") for p in server.prompts)


def test_right_answers_score_one_with_a_binomial_stderr(serve, tmp_path, capsys):
    right = {"n": 0}

    def mostly_right(prompt: str) -> str:  # about every 4th answer off by one
        right["n"] += 1
        text = adder(prompt)
        return text if zlib.crc32(prompt.encode()) % 4 else str(int(text.split("\n")[0]) + 1) + "\n"

    server = serve(mostly_right)
    out = tmp_path / "eval.json"
    assert main(["eval", "--url", server.url, "--task", "tiny-arith", "--json", str(out),
                 "--min-accuracy", "0.5"]) == 0
    doc = json.loads(out.read_text())
    expected = [0.0 if zlib.crc32(p.encode()) % 4 == 0 else 1.0 for p in _test_prompts()]
    assert doc["n"] == 500 and doc["items"] == expected
    p = sum(expected) / 500
    assert doc["value"] == pytest.approx(p)
    assert doc["stderr"] == pytest.approx((p * (1 - p) / 499) ** 0.5, rel=1e-6)  # sample std / sqrt(n)
    assert "tiny-arith  exact_match = " in capsys.readouterr().out
    assert all(stop == ["\n"] for stop in server.stops)  # the task's stop string reaches the server


def _test_prompts() -> list[str]:
    from k2bench.workloads.tasks import load_items, task_file

    return [it["question"] for it in load_items(task_file("tiny-arith", "test"))]


def test_gsm8k_format_file_through_lm_evals_own_definition(serve, tmp_path):
    data = tmp_path / "gsm.jsonl"
    rows = [{"question": f"Ann has {a} pens and gets {b} more. How many pens?", "answer": f"{a}+{b}\n#### {a + b}"}
            for a, b in [(3, 4), (10, 25), (7, 8), (100, 1)]]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def solver(prompt: str) -> str:
        a, b = (int(x) for x in prompt.split("has ")[1].split(" more")[0].split(" pens and gets "))
        return f" {a} plus {b}.\n#### {a + b if a != 7 else 0}\n\nQuestion: ignored"

    server = serve(solver)
    out = tmp_path / "g.json"
    assert main(["eval", "--url", server.url, "--task", "gsm8k", "--data", str(data), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["task"], doc["filter"], doc["n"], doc["items"]) == ("gsm8k", "strict-match", 4, [1.0, 1.0, 0.0, 1.0])
    assert all(p.startswith("Question: ") and p.endswith("\nAnswer:") for p in server.prompts)


def test_list_and_user_errors(capsys, tmp_path):
    assert main(["eval", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "tiny-arith" in listed and "gsm8k" in listed
    assert main(["eval", "--task", "tiny-arith"]) == 2
    assert main(["eval", "--url", "http://127.0.0.1:9", "--task", "nope"]) == 2
    assert main(["eval", "--url", "http://127.0.0.1:9", "--task", "gsm8k"]) == 2
    assert main(["eval", "--url", "http://127.0.0.1:9", "--task", "tiny-arith", "--min-accuracy", "95"]) == 2
    err = capsys.readouterr().err
    assert err.count("k2bench: error:") == 4 and "Traceback" not in err
    assert "--data" in err and "unknown eval task 'nope'" in err


def test_unreachable_server_is_one_line(capsys):
    from conftest import free_port

    assert main(["eval", "--url", f"http://127.0.0.1:{free_port()}", "--task", "tiny-arith"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("k2bench: error: cannot list models") and err.count("\n") == 1
