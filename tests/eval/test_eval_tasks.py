"""The shipped task data and the task configs built from it: local files only, clear errors."""

from __future__ import annotations

import pytest

from k2bench.errors import UserError
from k2bench.harness.eval.tasks import task_config
from k2bench.workloads.tasks import TASKS_DIR, load_items, task_file, write_tiny_arith


def test_shipped_files_are_what_the_generator_writes(tmp_path):
    write_tiny_arith(tmp_path)
    for split in ("train", "test"):
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (TASKS_DIR / "tiny_arith" / f"{split}.jsonl").read_bytes()


def test_held_out_items_are_correct_sums_never_seen_in_training():
    train = load_items(task_file("tiny-arith", "train"))
    test = load_items(task_file("tiny-arith", "test"))
    assert (len(train), len(test)) == (9500, 500)
    assert not {t["question"] for t in train} & {t["question"] for t in test}
    for item in test:
        a, b = item["question"].rstrip("=").split("+")
        assert int(item["answer"]) == int(a) + int(b)


def test_bad_data_lines_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1=", "answer": "2"}\n{"question": 3}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: expected an object"):
        load_items(bad)
    bad.write_text("not json\n")
    with pytest.raises(UserError, match=r"bad.jsonl:1: not JSON"):
        load_items(bad)


def test_gsm8k_needs_local_data_and_reads_only_it(tmp_path):
    with pytest.raises(UserError, match="--data"):
        task_config("gsm8k", None)
    with pytest.raises(UserError, match="no such file"):
        task_config("gsm8k", tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match="unknown eval task 'nope'"):
        task_config("nope", None)
    pytest.importorskip("lm_eval")
    data = tmp_path / "g.jsonl"
    data.write_text('{"question": "Tom has 2 apples and buys 3. How many?", "answer": "2+3=5\\n#### 5"}\n')
    cfg = task_config("gsm8k", data)
    assert cfg["dataset_path"] == "json" and cfg["dataset_kwargs"] == {"data_files": {"test": str(data)}}
    assert "dataset_name" not in cfg and cfg["test_split"] == "test"
    # lm-eval's own GSM8K answer extraction is kept
    assert [f["name"] for f in cfg["filter_list"]] == ["strict-match", "flexible-extract"]
