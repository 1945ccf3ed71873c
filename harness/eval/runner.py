"""Run one lm-evaluation-harness task against an OpenAI-compatible server and keep what the gate needs.

lm-eval's `local-completions` model sends each item to <url>/v1/completions as text (no tokenizer on
our side: tokenizer_backend none), greedy, with the task's stop strings. Its per-item scores are
kept (`items`), because the regression gate tests proportions on them, not just the mean.
Dataset and hub access are switched off before lm-eval is imported: task data comes from local
files only.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field

from k2bench.errors import ServerError, UserError
from k2bench.harness.eval.tasks import get_task, task_config

SCHEMA = "k2bench.eval/1"


@dataclass
class EvalResult:
    task: str
    metric: str
    value: float
    stderr: float | None
    n: int
    server: str
    model: str
    concurrency: int
    filter: str = "none"
    items: list[float] = field(default_factory=list)  # per-item scores in the task's document order

    def to_json(self) -> dict:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, doc: dict) -> EvalResult:
        if doc.get("schema") != SCHEMA:
            raise UserError(f"not a {SCHEMA} document (schema {doc.get('schema')!r})")
        fields = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        return cls(**fields)


def served_model(url: str, timeout: float = 10.0) -> str:
    """The first model id the server lists at /v1/models (requests must name it)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/v1/models", timeout=timeout) as resp:
            data = json.load(resp).get("data") or []
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ServerError(f"cannot list models at {url}/v1/models: {exc}") from exc
    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise ServerError(f"{url}/v1/models lists no model")
    return str(data[0]["id"])


def _offline() -> None:
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[var] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_eval(url: str, task: str, *, limit: int | None = None, concurrency: int = 8, data: str | None = None,
             model: str | None = None, timeout_s: int = 300) -> EvalResult:
    """Evaluate `task` on the server at `url` (scheme://host:port) and return its headline metric."""
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1, not {limit}")
    if concurrency < 1:
        raise UserError(f"--concurrency must be at least 1, not {concurrency}")
    info = get_task(task)
    config = task_config(task, data)
    url = url.rstrip("/")
    model = model or served_model(url)
    _offline()
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise UserError(f"k2bench eval needs lm-evaluation-harness: pip install 'k2bench[eval]' ({exc})") from exc
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"model": model, "base_url": f"{url}/v1/completions", "tokenizer_backend": "none",
                    "num_concurrent": concurrency, "max_retries": 3, "timeout": timeout_s},
        tasks=[config], limit=limit, log_samples=True, bootstrap_iters=1000,
        task_manager=TaskManager(include_defaults=False),  # our configs are complete: skip indexing lm-eval's
    )
    if out is None:
        raise ServerError("lm-eval returned no results")
    key = f"{info.metric},{info.filter}"
    res = out["results"][task]
    if key not in res:
        raise ServerError(f"lm-eval reported no {key} for {task} (got {sorted(res)})")
    samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
    items = [float(s[info.metric]) for s in samples if s.get("filter", info.filter) == info.filter]
    stderr = res.get(f"{info.metric}_stderr,{info.filter}")
    return EvalResult(task=task, metric=info.metric, value=float(res[key]),
                      stderr=float(stderr) if isinstance(stderr, (int, float)) else None, n=len(items),
                      server=url, model=model, concurrency=concurrency, filter=info.filter, items=items)
