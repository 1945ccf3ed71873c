"""The evaluation tasks k2bench knows, as lm-evaluation-harness task configs over local files only.

`tiny-arith` is the task shipped with the repo for the bundled tiny model; `gsm8k` takes lm-eval's own
GSM8K definition (prompt, stop strings, answer filters, metric) and points it at a GSM8K-format JSONL
given with --data, so nothing is fetched from a dataset hub at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k2bench.errors import UserError
from k2bench.workloads.tasks import load_items, task_file


@dataclass(frozen=True)
class TaskInfo:
    name: str
    description: str
    needs_data: bool  # True: the user gives the items with --data (no data ships with k2bench)
    metric: str  # the lm-eval metric reported
    filter: str  # the lm-eval filter whose result is reported ("none" when the task has no filters)


TASKS = {
    "tiny-arith": TaskInfo("tiny-arith", "two-digit addition (07+85=092), 500 held-out items (the bundled tiny model's task)",
                           False, "exact_match", "none"),
    "gsm8k": TaskInfo("gsm8k", "grade-school math (lm-eval's GSM8K definition) on a GSM8K-format JSONL "
                      "given with --data", True, "exact_match", "strict-match"),
}


def get_task(name: str) -> TaskInfo:
    if name not in TASKS:
        raise UserError(f"unknown eval task {name!r}; valid: {', '.join(TASKS)} (k2bench eval --list)")
    return TASKS[name]


def _tiny_arith(data: Path) -> dict:
    return {
        "task": "tiny-arith",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{question}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False, "temperature": 0.0},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "num_fewshot": 0,
        "metadata": {"version": 1.0},
    }


def _gsm8k(data: Path) -> dict:
    """lm-eval's installed gsm8k.yaml with its dataset replaced by the local file (zero-shot)."""
    import lm_eval.tasks
    import yaml

    definition = Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k.yaml"
    if not definition.is_file():
        raise UserError(f"this lm-eval install has no gsm8k task definition ({definition})")
    cfg = yaml.safe_load(definition.read_text())
    for key in ("tag", "dataset_name", "training_split", "fewshot_split"):
        cfg.pop(key, None)
    cfg.update(dataset_path="json", dataset_kwargs={"data_files": {"test": str(data)}}, test_split="test",
               num_fewshot=0)
    return cfg


def task_config(name: str, data: str | Path | None) -> dict:
    """The lm-eval config dict of a task, reading only local files (checked before lm-eval sees them)."""
    info = get_task(name)
    if info.needs_data and data is None:
        raise UserError(f"task {name} needs its items: --data PATH (a JSONL of question/answer objects)")
    path = Path(data) if data is not None else task_file(name, "test")
    if not path.is_file():
        raise UserError(f"--data {path}: no such file")
    load_items(path)  # a clear message for a bad file, before lm-eval's own errors
    return _tiny_arith(path) if name == "tiny-arith" else _gsm8k(path)
