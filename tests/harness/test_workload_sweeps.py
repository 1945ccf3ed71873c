"""Sweeps of dataset, shared-prefix and conversation workloads against the test server, checked against
what the server received and counted (its prefix-cache model, its /received prompts)."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from k2bench.harness.cli import main
from k2bench.harness.load.testserver import VOCAB_SIZE
from k2bench.harness.run.sweep import SweepConfig, run_sweep
from k2bench.harness.servers import launch
from k2bench.harness.store import Store
from k2bench.workloads import loader
from k2bench.workloads.loader import Workload

DATA = Path(loader.defs_dir()).parent / "data"
CACHE = ("--prefix-cache-blocks", "100000", "--cache-block-size", "16")


@contextlib.contextmanager
def serving(tmp_path, *args: str):
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=list(args), log_dir=tmp_path) as s:
        yield s.base_url


def _get(url: str):
    with urllib.request.urlopen(url) as resp:
        return json.loads(resp.read())


def _sweep(tmp_path, url: str, w: Workload, **kw) -> tuple[object, str]:
    db = f"sqlite:///{tmp_path}/k.db"
    cfg = SweepConfig(levels=kw.pop("levels", [4]), workload=w, url=url, db=db, **kw)
    return run_sweep(cfg), db


@pytest.mark.parametrize("metrics", [True, False])
def test_half_shared_prefix_measures_half_hit_rate(tmp_path, metrics: bool) -> None:
    """One group, prefix = half the prompt (whole 16-token blocks): every measured request finds exactly its
    first half cached, from the server's counters when it has /metrics, else from usage.cached_tokens."""
    w = Workload(name="half", isl=256, osl=4, prefix_len=128, prefix_groups=1)
    extra = CACHE if metrics else (*CACHE, "--no-cache-metrics")
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "1", *extra) as url:
        result, db = _sweep(tmp_path, url, w, num_prompts=20, warmup=0)
        server = _get(url + "/stats")
    assert result.status == "complete", result.points
    p = result.points[0]
    assert p["prefix_hit_rate"] == pytest.approx(0.5, abs=0.05)
    assert p["prefix_hit_source"] == ("k2bench_prefix_cache" if metrics else "usage.cached_tokens")
    # prime-then-measure: a warmup of 0 still sent one priming request per group
    assert server["requests"] == 21
    with Store.open(db, readonly=True) as store:
        reqs = store.requests_frame(result.run_id)
        run = store.export_run(result.run_id)["run"]
    assert (reqs["cached_tokens"] == 128).all() and (reqs["prompt_tokens"] == 256).all()
    assert run["workload_def"]["prefix_len"] == 128 and run["workload_def"]["seed"] == 0


def test_without_a_cache_the_hit_rate_is_zero_and_without_reports_absent(tmp_path) -> None:
    w = Workload(name="half", isl=64, osl=2, prefix_len=32)
    with serving(tmp_path, "--ttft-ms", "2", "--itl-ms", "1", "--prefix-cache-blocks", "1") as url:
        result, _ = _sweep(tmp_path, url, w, num_prompts=8, warmup=0, levels=[2])
    assert result.points[0]["prefix_hit_rate"] == 0  # a one-block cache never holds a 2-block prefix chain
    with serving(tmp_path, "--ttft-ms", "2", "--itl-ms", "1") as url:
        result, _ = _sweep(tmp_path, url, w, num_prompts=8, warmup=0, levels=[2])
    assert result.points[0].get("prefix_hit_rate") is None and result.points[0].get("prefix_hit_source") is None


def _server_answer(number: int, tokens: int) -> str:
    """What the test server streams as request ``number``'s answer (its own formula, one token a message)."""
    return "".join(f" t{(number * 7919 + i) % VOCAB_SIZE}" for i in range(tokens))


def test_conversation_turns_carry_the_servers_answers_and_per_turn_ttft(tmp_path) -> None:
    w = loader.load("chat-multiturn")
    w = Workload(**{**{f: getattr(w, f) for f in w.__dataclass_fields__}, "think_time_s": 0.05})
    with serving(tmp_path, "--ttft-ms", "10", "--itl-ms", "1", "--keep-prompts", *CACHE) as url:
        result, db = _sweep(tmp_path, url, w, num_prompts=9, warmup=3, levels=[2])
        received = _get(url + "/received")
        streams = {s["number"]: s for s in _get(url + "/stats?streams=1")["streams"]}
    assert result.status == "complete"
    assert len(received) == 12  # 1 warmup + 3 measured sessions, 3 turns each
    by_history = {json.dumps(r["messages"]): r["number"] for r in received}
    later = [r for r in received if len(r["messages"]) > 1]
    assert len(later) == 8
    for r in later:
        msgs = r["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant"] * (len(msgs) // 2) + ["user"]
        for j in range(1, len(msgs), 2):  # each answer is what the server sent for the turn before it
            earlier = by_history[json.dumps(msgs[:j])]
            assert msgs[j]["content"] == _server_answer(earlier, streams[earlier]["tokens"])
    p = result.points[0]
    assert sorted(p["turns"]) == ["1", "2", "3"] and all(t["requests"] == 3 for t in p["turns"].values())
    assert all(t["ttft_ms_median"] >= 10 for t in p["turns"].values())
    assert p["turns"]["1"]["hit_rate"] == 0 and p["turns"]["3"]["hit_rate"] > 0.5  # the history is cached
    with Store.open(db, readonly=True) as store:
        reqs = store.requests_frame(result.run_id)
    assert sorted(reqs["turn"].tolist()) == [1, 1, 1, 2, 2, 2, 3, 3, 3] and reqs["session"].nunique() == 3


def test_jsonl_token_mode_exact_lengths_and_sharegpt_text_mode_through_chat(tmp_path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"tell me about item {i} " * (i + 1)}) + "\n" for i in range(5)))
    tok = Workload(name="j", isl=24, osl=3, source="jsonl", path=str(f))
    chat = Workload(name="s", isl=16, osl=3, source="sharegpt", path=str(DATA / "conversations.json"), mode="text")
    with serving(tmp_path, "--ttft-ms", "2", "--itl-ms", "1", "--keep-prompts") as url:
        r1, _ = _sweep(tmp_path, url, tok, num_prompts=6, warmup=0, levels=[2])
        r2, _ = _sweep(tmp_path, url, chat, num_prompts=4, warmup=0, levels=[2])
        received = _get(url + "/received")
    assert r1.status == r2.status == "complete"
    assert r1.points[0]["input_tokens"] == 6 * 24  # the server counted exactly the length asked for
    assert all(isinstance(r["prompt"], list) and len(r["prompt"]) == 24 for r in received[:6])
    firsts = {c["conversations"][0]["value"].split()[0] for c in json.loads((DATA / "conversations.json").read_text())}
    for r in received[6:]:
        assert len(r["messages"]) == 1 and len(r["messages"][0]["content"].split()) == 16
        assert r["messages"][0]["content"].split()[0] in firsts
    assert r2.points[0]["input_tokens"] == 4 * 16


def test_sharegpt_token_mode_and_jsonl_text_mode(tmp_path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"q": f"what is item {i} " * 6}) + "\n" for i in range(4)))
    tok = Workload(name="s", isl=20, osl=2, source="sharegpt", path=str(DATA / "conversations.json"))
    chat = Workload(name="j", isl=10, osl=2, source="jsonl", path=str(f), prompt_field="q", mode="text")
    with serving(tmp_path, "--ttft-ms", "2", "--itl-ms", "1", "--keep-prompts") as url:
        r1, _ = _sweep(tmp_path, url, tok, num_prompts=3, warmup=0, levels=[1])
        r2, _ = _sweep(tmp_path, url, chat, num_prompts=3, warmup=0, levels=[1])
        received = _get(url + "/received")
    assert [len(r["prompt"]) for r in received[:3]] == [20] * 3 and r1.points[0]["input_tokens"] == 60
    assert [r["messages"][0]["content"].split()[:2] for r in received[3:]] == [["what", "is"]] * 3
    assert r2.points[0]["input_tokens"] == 30


def test_malformed_dataset_is_refused_with_its_line_and_nothing_stored(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "fine too"}\n{"prompt": oops}\n')
    toml = tmp_path / "w.toml"
    toml.write_text(f'name = "bad"\nisl = 8\nosl = 2\nsource = "jsonl"\npath = "{bad}"\n')
    db = tmp_path / "k.db"
    code = main(["sweep", "--engine", "testserver", "--workload", str(toml), "--conc", "1", "--num-prompts", "2",
                 "--db", f"sqlite:///{db}"])
    err = capsys.readouterr().err
    assert code == 2 and "bad.jsonl, line 3: not JSON" in err and "Traceback" not in err
    if db.exists():
        with Store.open(f"sqlite:///{db}", readonly=True) as store:
            assert store.list_runs() == []


def test_workload_fields_survive_export_and_import(tmp_path) -> None:
    """workload_def, hit rate, turns and each request's session, turn and cached tokens go through the
    k2bench.run JSON and back unchanged (the fingerprint with them)."""
    w = Workload(name="conv", isl=12, osl=3, source="sharegpt", path=str(DATA / "conversations.json"), mode="text",
                 turns=2)
    with serving(tmp_path, "--ttft-ms", "2", "--itl-ms", "1", *CACHE) as url:
        result, db = _sweep(tmp_path, url, w, num_prompts=4, warmup=0, levels=[2])
    with Store.open(db, readonly=True) as store:
        doc = store.export_run(result.run_id, include_requests=True)
    doc = json.loads(json.dumps(doc))
    with Store.open(f"sqlite:///{tmp_path}/other.db") as other:
        again = other.export_run(other.import_run(doc), include_requests=True)
    assert again["run"]["workload_def"] == doc["run"]["workload_def"] and doc["run"]["workload_def"]["turns"] == 2
    assert again["run"]["fingerprint"] == doc["run"]["fingerprint"]
    for key in ("prefix_hit_rate", "prefix_hit_source", "turns"):
        assert again["points"][0][key] == doc["points"][0][key] is not None, key
    got = [(r["session"], r["turn"], r["cached_tokens"]) for r in again["requests"]]
    assert got == [(r["session"], r["turn"], r["cached_tokens"]) for r in doc["requests"]]
    assert {t for _, t, _ in got} == {1, 2} and all(c is not None for _, _, c in got)


def test_trace_replay_follows_the_trace_and_its_implied_hit_rate(tmp_path) -> None:
    """The shipped 1,000-request trace at 1/20 of its time (about 6 s): requests are scheduled at the trace's
    scaled timestamps, the server receives them in that shape (checked on its own arrival stamps), send lag
    is reported, and a 512-token-block cache measures the hit rate the hash ids imply (within 0.01)."""
    from k2bench.workloads import trace

    scale = 0.05
    rows = trace.read_trace(loader.SHIPPED_TRACE)
    want = trace.send_offsets_s(rows, scale)
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", "2", "--itl-ms", "1", "--prefix-cache-blocks", "1000000",
                 "--cache-block-size", "512") as url:
        # through the CLI with its default levels: nothing but the trace reaches the server (no probe)
        assert main(["sweep", "--url", url, "--trace", str(loader.SHIPPED_TRACE), "--trace-time-scale",
                     str(scale), "--db", db, "--eval", "none", "--max-send-lag", "60000"]) == 0
        streams = sorted(_get(url + "/stats?streams=1")["streams"], key=lambda s: s["number"])
    assert len(streams) == 1000
    with Store.open(db, readonly=True) as store:
        (run,) = store.list_runs()
        doc = store.export_run(run["id"], include_requests=True)
    (p,) = doc["points"]
    assert p["mode"] == "rate" and p["completed"] == 1000 and p["valid"] and p["send_lag_p50_ms"] is not None
    assert p["send_lag_p99_ms"] is not None and p["rate"] == pytest.approx(999 / want[-1])
    reqs = sorted(doc["requests"], key=lambda r: r["index"])
    t0 = reqs[0]["intended_ns"]
    assert [(r["intended_ns"] - t0) / 1e9 for r in reqs] == pytest.approx(want, abs=1e-6)
    assert [r["requested_input_tokens"] for r in reqs] == [r.input_length for r in rows]
    assert doc["run"]["workload_def"]["time_scale"] == scale
    arrived = [s["arrived"] - streams[0]["arrived"] for s in streams]
    assert arrived[-1] == pytest.approx(want[-1], rel=0.15)  # the server saw the trace's span (busy host: lag)
    assert np.corrcoef(arrived, sorted(want))[0, 1] > 0.99
    implied = trace.implied_hit_rate(rows, 512)
    assert p["prefix_hit_source"] == "k2bench_prefix_cache"
    assert p["prefix_hit_rate"] == pytest.approx(implied, abs=0.01)
