"""Workload definitions beyond random prompts: keys, dataset files (JSONL, ShareGPT, corpus), shared
prefixes and Mooncake traces, checked on the prompts built (no load is sent here, except to tokenize)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from k2bench.errors import UserError
from k2bench.harness.servers import launch
from k2bench.workloads import build, datasets, loader, trace
from k2bench.workloads import prompts as prompts_mod

DATA = Path(loader.defs_dir()).parent / "data"
TRACE = DATA / "trace_1k.jsonl"


def test_shipped_definitions_and_examples_load() -> None:
    assert {"8k1k", "1k1k", "1k8k", "prefix50", "chat-multiturn"} <= set(loader.available())
    assert loader.load("8k1k").definition() is None  # classic: fingerprinted by name and lengths as before
    chat = loader.load("chat-multiturn")
    assert chat.turns == 3 and Path(chat.path).is_file()
    assert chat.definition()["path"] == "conversations.json" and len(chat.definition()["file_sha256"]) == 16


def test_generated_fixtures_are_what_the_script_writes(tmp_path, monkeypatch) -> None:
    from k2bench.workloads.data import generate

    monkeypatch.setattr(generate, "HERE", tmp_path)
    generate.main()
    for name in ("conversations.json", "trace_1k.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


@pytest.mark.parametrize("doc, words", [
    ({"source": "jsonl"}, "needs path"),
    ({"source": "web", "path": "x"}, "source must be one of"),
    ({"lengths": "dataset"}, "needs a jsonl or sharegpt"),
    ({"lengths": "uniform"}, "range_ratio below 1"),
    ({"prefix_len": 64}, "prefix_len must be below"),
    ({"turns": 2}, "mode = 'text'"),
    ({"turns": 0}, "turns must be a whole number >= 1"),
    ({"prefix_len": 8, "prefix_groups": 0}, "prefix_groups"),
])
def test_inconsistent_definitions_are_refused(doc: dict, words: str) -> None:
    with pytest.raises(UserError, match=words):
        loader.Workload(**{"name": "b", "isl": 64, "osl": 8, **doc})


def test_missing_dataset_file_says_nothing_is_downloaded(tmp_path) -> None:
    (tmp_path / "w.toml").write_text('name = "w"\nisl = 8\nosl = 4\nsource = "jsonl"\npath = "absent.jsonl"\n')
    with pytest.raises(UserError, match="nothing is downloaded"):
        loader.load(str(tmp_path / "w.toml"))


def test_shared_prefix_prompts_share_exactly_the_prefix() -> None:
    w = loader.Workload(name="p", isl=40, osl=4, prefix_len=16, prefix_groups=3)
    ps = prompts_mod.token_prompts(w, 9, seed=5)
    ids = [np.asarray(p.token_ids) for p in ps]
    assert all(len(x) == 40 for x in ids)
    for i, x in enumerate(ids):
        same = ids[i % 3]
        assert (x[:16] == same[:16]).all()
        assert not (x[16:] == ids[(i + 1) % 9][16:]).all()
    assert not (ids[0][:16] == ids[1][:16]).all()  # groups differ
    again = prompts_mod.token_prompts(w, 3, seed=99)  # another level: the same group prefixes
    assert (np.asarray(again[0].token_ids)[:16] == ids[0][:16]).all()


# ---------------------------------------------------------------- dataset files
def test_jsonl_reads_prompts_and_output_lengths(tmp_path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"q": "hello there", "n": 5}\n\n{"q": "second one", "n": 7}\n')
    got = datasets.read_jsonl(f, "q", "n")
    assert [(s.text, s.output_len, s.line) for s in got] == [("hello there", 5, 1), ("second one", 7, 3)]


@pytest.mark.parametrize("body, line, words", [
    ('{"prompt": "a"}\n{"prompt": "b"\n', 2, "not JSON"),
    ('{"prompt": "a"}\n\n[1, 2]\n', 3, "expected a JSON object"),
    ('{"prompt": "a"}\n{"text": "b"}\n', 2, "no text in field 'prompt'"),
])
def test_malformed_jsonl_is_refused_with_its_line(tmp_path, body: str, line: int, words: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(body)
    with pytest.raises(UserError, match=f"line {line}: {words}"):
        datasets.read_jsonl(f)


def test_sharegpt_array_and_lines_give_turns_and_answers(tmp_path) -> None:
    convs = datasets.read_sharegpt(DATA / "conversations.json")
    assert len(convs) == 40 and all(len(c.user) >= 3 and len(c.answers) == len(c.user) for c in convs)
    raw = json.loads((DATA / "conversations.json").read_text())
    assert convs[1].user[1] == raw[1]["conversations"][2]["value"]
    lines = tmp_path / "s.jsonl"
    lines.write_text("\n".join(json.dumps(c) for c in raw[:2]) + "\n")
    assert datasets.read_sharegpt(lines)[1] == datasets.Conversation(convs[1].user, convs[1].answers, 2)


def test_malformed_sharegpt_is_refused_with_the_line_of_the_entry(tmp_path) -> None:
    f = tmp_path / "bad.json"
    f.write_text('[\n {"conversations": [{"from": "human", "value": "hi"}]},\n {"conversations": [{"from": 3}]}\n]\n')
    with pytest.raises(UserError, match="line 3: each turn needs"):
        datasets.read_sharegpt(f)
    f.write_text('[\n {"conversations": []},\n {"conversations": [}\n]\n')
    with pytest.raises(UserError, match="line 3: not JSON"):
        datasets.read_sharegpt(f)


# ---------------------------------------------------------------- traces
def test_trace_blocks_are_identical_for_equal_hash_ids() -> None:
    rows = trace.read_trace(TRACE)
    assert len(rows) == 1000
    w = loader.for_trace(str(TRACE), time_scale=0.5)
    ps = build.trace_prompts(w)
    assert [p.input_len for p in ps] == [len(p.token_ids) for p in ps] == [r.input_length for r in rows]
    blocks: dict[int, np.ndarray] = {}
    checked = 0
    for r, p in zip(rows, ps, strict=True):
        ids = np.asarray(p.token_ids)
        for j, h in enumerate(r.hash_ids):
            block = ids[j * 512:(j + 1) * 512]
            seen = blocks.setdefault(h, block)
            n = min(len(seen), len(block))
            assert (seen[:n] == block[:n]).all()
            checked += h in blocks and n > 0
    assert checked > 1000
    # distinct hash ids give distinct blocks
    a, b = ps[0].token_ids[:512], ps[1].token_ids[:512]
    assert rows[0].hash_ids[0] != rows[1].hash_ids[0] and not (np.asarray(a) == np.asarray(b)).all()
    assert [p.send_at_s for p in ps[:3]] == pytest.approx([0.0, (683 - 367) / 2e3, (769 - 367) / 2e3])


def test_implied_hit_rate_by_hand() -> None:
    rows = [trace.TraceRow(0, 1024, 4, (1, 2)), trace.TraceRow(1, 1500, 4, (1, 2, 3)),
            trace.TraceRow(2, 600, 4, (1, 9)), trace.TraceRow(3, 1024, 4, (5, 2))]
    # row 2 hits blocks 1 and 2 (1024 of 1500); row 3 hits block 1 (512 of 600); row 4 misses at its first block
    assert trace.implied_hit_rate(rows, 512) == pytest.approx((1024 + 512) / (1024 + 1500 + 600 + 1024))


@pytest.mark.parametrize("line, words", [
    ('{"timestamp": 5, "input_length": 0, "output_length": 3, "hash_ids": []}', "input_length must be"),
    ('{"timestamp": 1, "input_length": 4, "output_length": 3, "hash_ids": []}', "timestamps must not go back"),
    ('{"timestamp": 9, "input_length": 4, "output_length": 3, "hash_ids": ["a"]}', "hash_ids must be"),
    ("not json", "not JSON"),
])
def test_malformed_trace_is_refused_with_its_line(tmp_path, line: str, words: str) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 2, "input_length": 4, "output_length": 3, "hash_ids": [1]}\n' + line + "\n")
    with pytest.raises(UserError, match=f"line 2: {words}"):
        trace.read_trace(f)


def test_trace_excludes_workload_and_lengths() -> None:
    with pytest.raises(UserError, match="leave out --workload"):
        loader.resolve(None, 64, None, trace=str(TRACE))
    w = loader.resolve(None, None, None, trace=str(TRACE))
    assert (w.source, w.path, w.name) == ("trace", str(TRACE), "trace:trace_1k")


# ---------------------------------------------------------------- through the server's tokenizer
def test_dataset_prompts_in_token_mode_have_exact_lengths_and_text_mode_is_chat(tmp_path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"question {i} " + "word " * (3 * i), "out": 3 + i}) + "\n"
                         for i in range(6)))
    with launch.from_recipe("testserver", model="m", log_dir=tmp_path) as server:
        url = server.base_url
        w = loader.Workload(name="j", isl=12, osl=5, source="jsonl", path=str(f), output_field="out")
        ps = build.dataset_prompts(w, 8, base_url=url, model="m", seed=1)
        assert [len(p.token_ids) for p in ps] == [12] * 8 and {p.output_len for p in ps} == {5}
        own = build.dataset_prompts(loader.Workload(name="j", isl=12, osl=5, source="jsonl", path=str(f),
                                                    output_field="out", lengths="dataset"), 6, base_url=url, seed=1)
        # the text's own length (word-level tokenizer: one token a word) and the file's output length
        assert sorted((p.input_len, p.output_len) for p in own) == [(2 + 3 * i, 3 + i) for i in range(6)]
        sg = loader.Workload(name="s", isl=20, osl=6, source="sharegpt", path=str(DATA / "conversations.json"),
                             mode="text")
        chat = build.dataset_prompts(sg, 4, base_url=url, seed=2)
        assert all(p.chat and p.token_ids is None and len(p.text.split()) == 20 for p in chat)
        corpus = tmp_path / "c.txt"
        corpus.write_text("alpha beta gamma delta " * 10)
        cw = loader.Workload(name="c", isl=30, osl=4, source="text", path=str(corpus))
        assert [len(p.token_ids) for p in build.dataset_prompts(cw, 3, base_url=url)] == [30] * 3
    with pytest.raises(UserError, match="needs the server's tokenizer"):
        build.dataset_prompts(w, 2)


def test_built_trace_prompts_give_the_implied_hit_rate_in_a_cache_of_trace_blocks() -> None:
    """The shipped trace's prompts, in order, through the test server's prefix-cache model: with 512-token
    blocks it finds what the hash ids imply (to 1e-4; it caps a fully cached prompt at length - 1); with
    16-token blocks it also hits inside partial last blocks, so a little more."""
    from k2bench.harness.load.testserver_models import PrefixCache

    w = loader.for_trace(str(TRACE))
    ids = [np.asarray(p.token_ids).tolist() for p in build.trace_prompts(w)]
    implied = trace.implied_hit_rate(trace.read_trace(TRACE), 512)
    assert 0.6 < implied < 0.7
    for block, low, high in ((512, implied - 1e-4, implied + 1e-4), (16, implied, implied + 0.06)):
        cache = PrefixCache(10**7, block)
        for x in ids:
            cache.lookup_and_insert(x)
        assert low <= cache.hits / cache.queries <= high, block
