"""Stored names reach the dashboard's markdown captions as inert text (no link, image or emphasis)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")

from streamlit.testing.v1 import AppTest  # noqa: E402

from k2bench.harness.store import Store  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
FIXTURE = Path(__file__).resolve().parents[1] / "harness" / "fixtures" / "run_small.json"
TASK = "[click](https://e.invalid) ![x](https://e.invalid/x.png) **<b>"


def test_run_detail_accuracy_caption_escapes_the_task_name(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    doc = json.loads(FIXTURE.read_text())
    doc["evals"] = [{"task": TASK, "metric": "exact_match", "value": 0.5, "n": 2}]
    with Store.open(url) as store:
        run_id = store.import_run(doc)
    monkeypatch.setenv("K2BENCH_DB", url)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["page"] = "Run detail"
    at.query_params["run"] = str(run_id)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    (caption,) = [c.value for c in at.caption if "e.invalid" in c.value]
    assert "\\[click\\]" in caption and "\\*\\*" in caption and "&lt;b&gt;" in caption  # shown, not rendered
