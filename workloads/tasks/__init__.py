"""Evaluation task data shipped with k2bench (data files, one folder per task) and their loader.

`tiny_arith/` is two-digit addition in a fixed-width format ("07+85=" -> "092": operands of two digits,
sums of three, so every digit sits at the same position in every item): the task the bundled tiny model is trained on
(train.jsonl) and evaluated on (test.jsonl, held out: no pair appears in both). The files are generated
by `make_tiny_arith` and committed, so training and evaluation never depend on a generator's version.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from k2bench.errors import UserError

TASKS_DIR = Path(__file__).parent
TINY_ARITH_TEST_SIZE = 500


def task_file(task: str, split: str) -> Path:
    """The JSONL file of a shipped task's split (folders use underscores, task names dashes)."""
    path = TASKS_DIR / task.replace("-", "_") / f"{split}.jsonl"
    if not path.is_file():
        raise UserError(f"no shipped data for task {task!r} split {split!r} ({path})")
    return path


def load_items(path: str | Path) -> list[dict]:
    """Read a JSONL file of {"question", "answer"} items, naming the line of any bad one."""
    items = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{n}: not JSON ({exc.msg})") from exc
            if not isinstance(item, dict) or not isinstance(item.get("question"), str) \
                    or not isinstance(item.get("answer"), str):
                raise UserError(f"{path}:{n}: expected an object with string 'question' and 'answer'")
            items.append(item)
    if not items:
        raise UserError(f"{path}: no items")
    return items


def make_tiny_arith(seed: int = 0, test_size: int = TINY_ARITH_TEST_SIZE) -> dict[str, list[dict]]:
    """All 10,000 sums a+b with 0 <= a, b <= 99, shuffled with `seed` and split into train and test."""
    pairs = [(a, b) for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(pairs)
    items = [{"question": f"{a:02d}+{b:02d}=", "answer": f"{a + b:03d}"} for a, b in pairs]
    return {"test": items[:test_size], "train": items[test_size:]}


def write_tiny_arith(out_dir: str | Path = TASKS_DIR / "tiny_arith") -> None:
    """Regenerate the shipped files (kept for reproducibility; a test checks they still match)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, items in make_tiny_arith().items():
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(item) + "\n" for item in items)
