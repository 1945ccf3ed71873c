"""The run page's workload section: per-turn TTFT of a conversation run and per-request prompt lengths and
cached tokens, from a real sweep against the test server (its prefix-cache model on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from k2bench.harness.run.sweep import SweepConfig, run_sweep  # noqa: E402
from k2bench.harness.servers import launch  # noqa: E402
from k2bench.workloads.loader import Workload, defs_dir  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
CONVERSATIONS = str(Path(defs_dir()).parent / "data" / "conversations.json")


def test_conversation_run_shows_turns_lengths_and_definition(tmp_path, monkeypatch) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    w = Workload(name="conv", isl=16, osl=4, source="sharegpt", path=CONVERSATIONS, mode="text", turns=2,
                 lengths="dataset")
    with launch.from_recipe("testserver", model="m", log_dir=tmp_path,
                            extra_args=["--ttft-ms", "3", "--itl-ms", "1", "--prefix-cache-blocks", "10000"]) as s:
        result = run_sweep(SweepConfig(levels=[2], workload=w, url=s.base_url, db=db, num_prompts=4, warmup=0))
    assert result.status == "complete"
    monkeypatch.setenv("K2BENCH_DB", db)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["page"] = "Run detail"
    at.run()
    at.selectbox(key="detail_run").set_value(result.run_id).run()
    assert not at.exception, [e.value for e in at.exception]
    turns = next(d.value for d in at.dataframe if "turn" in d.value.columns)
    assert list(turns["turn"]) == [1, 2] and list(turns["requests"]) == [2, 2]
    stored = result.points[0]["turns"]
    assert list(turns["TTFT p50 ms"]) == pytest.approx([stored["1"]["ttft_ms_median"], stored["2"]["ttft_ms_median"]])
    assert any('"turns"' in j.proto.body and "conversations.json" in j.proto.body for j in at.json)
    figs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    lengths = next(f for f in figs if f["layout"]["title"]["text"] == "Prompt lengths per request")
    assert [t["name"] for t in lengths["data"]] == ["prompt tokens", "cached tokens"]
