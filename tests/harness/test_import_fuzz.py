"""Hostile and mutated import files: each one is a clean user error (exit 2, one line) with nothing
stored, or a faithful import; one command's files go in together or not at all."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from k2bench.harness.cli import main
from k2bench.harness.record.runjson import validate_doc
from k2bench.harness.store import Store

FIXTURE = Path(__file__).parent / "fixtures" / "run_small.json"
FLEET = Path(__file__).parents[1] / "fleet" / "fixtures"
VLLM = FLEET / "vllm-inf-concurrency4-Qwen3-0.6B.json"
AIPERF = FLEET / "profile_export_aiperf.json"


@pytest.fixture
def db(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'fuzz.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_db(request, tmp_path) -> str:
    """SQLite, and PostgreSQL where it runs: its 32-bit INTEGER and its text rules are stricter."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fuzz.db'}"
    return request.getfixturevalue("pg_url")


def _stored(db: str) -> int:
    with Store.open(db) as store:
        return len(store.list_runs())


def _refused(db: str, argv: list[str], capsys, words: str = "") -> str:
    """The command exits 2 with one line naming the problem, and stores nothing."""
    before = _stored(db)
    assert main([*argv, "--db", db]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("k2bench: error:") and len(err.splitlines()) == 1, err
    assert words in err, err
    assert _stored(db) == before
    return err


def _doc() -> dict:
    return json.loads(FIXTURE.read_text())


def _set(doc: dict, path: tuple, value) -> dict:
    doc = copy.deepcopy(doc)
    obj = doc
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value
    return doc


# (case name, path in the fixture, value, words the error must contain)
HOSTILE = [
    ("nan count", ("points", 0, "completed"), float("nan"), "points[0].completed"),
    ("infinite latency", ("points", 1, "ttft_ms", "p99"), float("inf"), "points[1].ttft_ms.p99"),
    ("nan in run.extra", ("run", "extra"), {"x": [1, float("nan")]}, "run.extra.x[1]"),
    ("2^63 count", ("points", 0, "num_prompts"), 2**63, "64-bit"),
    ("2^63 in run.extra", ("run", "extra"), {"n": 2**63}, "64-bit"),
    ("2^40 concurrency", ("points", 0, "concurrency"), 2**40, "32-bit"),
    ("negative ttft", ("points", 0, "ttft_ms", "median"), -5.0, "points[0].ttft_ms.median"),
    ("negative tpot", ("points", 2, "tpot_ms", "p90"), -0.1, "points[2].tpot_ms.p90"),
    ("fractional count", ("points", 0, "num_prompts"), 39.7, "points[0].num_prompts"),
    ("zero duration", ("points", 0, "duration_s"), 0.0, "points[0].duration_s"),
    ("negative duration", ("points", 0, "duration_s"), -1.0, "points[0].duration_s"),
    ("absurd throughput", ("points", 0, "tput_per_gpu"), 1e308, "not physical"),
    ("absurd interactivity", ("points", 0, "interactivity", "median"), 1e12, "not physical"),
    ("negative cost", ("points", 0, "usd_per_mtok"), -1.0, "usd_per_mtok"),
    ("negative server queue", ("points", 0, "server_queue_ms"), {"mean": -5.0, "median": 1.0, "p99": 2.0},
     "points[0].server_queue_ms.mean"),
    ("negative server ttft", ("points", 1, "server_ttft_ms"), -1.0, "points[1].server_ttft_ms"),
    ("acceptance below one", ("points", 0, "spec_accept_len"), 0.5, "points[0].spec_accept_len"),
    ("acceptance rate above one", ("points", 0, "spec_accept_rate"), 1.5, "points[0].spec_accept_rate"),
    ("long model name", ("run", "model"), "m" * 1000, "capped at 200"),
    ("long tag", ("run", "tags"), {"ci": "t" * 201}, "capped at 200"),
    ("NUL in model", ("run", "model"), "tiny\x00k2", "NUL"),
    ("lone surrogate", ("run", "notes"), "\ud800", "surrogate"),
    ("deep run.extra", ("run", "extra"), json.loads("[" * 100 + "]" * 100), "nested"),
    ("points not a list", ("points",), 5, "points: expected a list"),
    ("stamps out of range", ("requests", 0, "token_delta_ns"), [2**62, 2**62], "64-bit"),
]


@pytest.mark.parametrize("name,path,value,words", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_value_is_one_clean_error(db, tmp_path, capsys, name, path, value, words):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_set(_doc(), path, value)))
    _refused(db, ["import", str(bad)], capsys, words)


@pytest.mark.parametrize("name,raw,words", [
    ("bad utf-8", FIXTURE.read_bytes().replace(b'"tiny-k2"', b'"tiny-\xff\xfek2"', 1), "not UTF-8"),
    ("200k-deep nesting", b'{"run": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "nested"),
    ("huge integer", FIXTURE.read_bytes().replace(b'"num_gpus": 2', b'"num_gpus": ' + b"9" * 5000, 1), "64-bit"),
    ("1e999", FIXTURE.read_bytes().replace(b'"duration_s": 0.084348', b'"duration_s": 1e999', 1), "finite"),
    ("NaN literal", FIXTURE.read_bytes().replace(b'"completed": 4', b'"completed": NaN', 1), "points[0].completed"),
])
def test_hostile_bytes_are_one_clean_error(db, tmp_path, capsys, name, raw, words):
    assert raw != FIXTURE.read_bytes()
    bad = tmp_path / "bad.json"
    bad.write_bytes(raw)
    _refused(db, ["import", str(bad)], capsys, words)


def test_a_bad_second_file_stores_nothing_of_the_first(any_db, tmp_path, capsys):
    db = any_db
    ok = tmp_path / "ok.json"
    ok.write_text(FIXTURE.read_text())
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(_set(_doc(), ("points", 0, "concurrency"), 2**40)))
    _refused(db, ["import", str(ok), str(huge)], capsys, "huge.json")
    again = tmp_path / "again.json"  # the same run twice in one command: the second is the copy
    again.write_text(FIXTURE.read_text())
    _refused(db, ["import", str(ok), str(again)], capsys, "again.json: this run is already stored")
    assert main(["import", str(ok), str(again), "--allow-duplicate", "--db", db]) == 0
    assert _stored(db) == 2


def _vllm(**over) -> dict:
    raw = json.loads(VLLM.read_text())
    raw.update(over)
    return raw


def _aiperf(metric: str, avg) -> dict:
    raw = json.loads(AIPERF.read_text())
    raw[metric]["avg"] = avg
    return raw


def _aiperf_config(section: str, value) -> dict:
    raw = json.loads(AIPERF.read_text())
    raw["input_config"][section] = value
    return raw


@pytest.mark.parametrize("name,source,raw,words", [
    ("vllm fractional completed", "vllm", _vllm(completed=39.7), "completed"),
    ("vllm fractional tokens", "vllm", _vllm(total_input_tokens=40959.5), "total_input_tokens"),
    ("vllm nan duration", "vllm", _vllm(duration=float("nan")), "duration"),
    ("vllm zero duration", "vllm", _vllm(duration=0), "duration_s"),
    ("vllm negative ttft", "vllm", _vllm(median_ttft_ms=-3.0), "ttft_ms.median"),
    ("vllm absurd throughput", "vllm", _vllm(total_token_throughput=1e308), "not physical"),
    ("vllm failed as text", "vllm", _vllm(failed="none"), "failed"),
    ("vllm 2^63 tokens", "vllm", _vllm(total_output_tokens=2**63), "64-bit"),
    ("aiperf fractional count", "aiperf", _aiperf("request_count", 39.7), "request_count"),
    ("aiperf negative duration", "aiperf", _aiperf("benchmark_duration", -5.0), "duration_s"),
    ("aiperf absurd throughput", "aiperf", _aiperf("output_token_throughput", 1e300), "not physical"),
    ("aiperf endpoint not an object", "aiperf", _aiperf_config("endpoint", "x"), "endpoint"),
    ("aiperf loadgen not an object", "aiperf", _aiperf_config("loadgen", 3.5), "loadgen"),
])
def test_other_tools_files_get_the_same_checks(db, tmp_path, capsys, name, source, raw, words):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    _refused(db, ["import", "--from", source, str(bad), "--gpus", "2"], capsys, words)


POOL = [float("nan"), float("inf"), -1, 0, 1, 0.5, 39.7, 2**31, 2**63, -(2**63) - 1, 1e308, -1e-9, "x", "",
        "[/red]<img onerror=x>|@everyone", "\x00", None, True, [], {}, [1, [2, [3]]], {"deep": [[[[]]]]}, "m" * 300]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _paths(v, (*prefix, i))


def _mutate(doc: dict, rng: random.Random) -> dict:
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(doc) if p]
        path = rng.choice(paths)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = rng.random()
        if action < 0.1 and isinstance(parent, dict):
            del parent[path[-1]]
        elif action < 0.15 and isinstance(parent, dict):
            parent["unknown_" + str(rng.randint(0, 9))] = 1
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(POOL))
    return doc


def test_random_mutations_are_clean_errors_or_faithful_imports(any_db, tmp_path, capsys):
    db = any_db
    rng = random.Random(20261202)
    base = _doc()
    outcomes = {"error": 0, "imported": 0}
    for i in range(60):
        doc = _mutate(copy.deepcopy(base), rng)
        path = tmp_path / f"m{i}.json"
        path.write_text(json.dumps(doc))  # allow_nan: NaN/Infinity reach the file as Python writes them
        before = _stored(db)
        code = main(["import", str(path), "--allow-duplicate", "--db", db])
        captured = capsys.readouterr()
        if code == 0:
            outcomes["imported"] += 1
            want = validate_doc(doc)
            with Store.open(db) as store:
                got = store.export_run(store.list_runs()[0]["id"])
            assert got["points"] == want["points"], i
            assert {k: got["run"][k] for k in want["run"] if want["run"][k] is not None and k != "id"} == \
                {k: v for k, v in want["run"].items() if v is not None and k != "id"}, i
            assert _stored(db) == before + 1
        else:
            outcomes["error"] += 1
            err = captured.err.strip()
            assert code == 2 and err.startswith("k2bench: error:") and len(err.splitlines()) == 1, (i, err)
            assert _stored(db) == before, i
    assert outcomes["error"] > 10 and outcomes["imported"] > 3, outcomes  # both branches exercised


@pytest.mark.parametrize("source,fixture", [("vllm", VLLM), ("aiperf", AIPERF),
                                            ("inferencex", FLEET / "agg_kimik2.5_fp4_atom_tp4_conc4_isl8192_osl1024.json")])
def test_random_mutations_of_other_tools_files(db, tmp_path, capsys, source, fixture):
    rng = random.Random(7)
    base = json.loads(fixture.read_text())
    codes = []
    for i in range(40):
        path = tmp_path / f"{source}{i}.json"
        path.write_text(json.dumps(_mutate(copy.deepcopy(base), rng)))
        before = _stored(db)
        code = main(["import", "--from", source, str(path), "--gpus", "2", "--allow-duplicate", "--db", db])
        err = capsys.readouterr().err.strip()
        assert code in (0, 2), (i, err)
        assert _stored(db) == before + (code == 0), i
        if code == 2:
            assert err.startswith("k2bench: error:") and len(err.splitlines()) == 1, (i, err)
        codes.append(code)
    assert codes.count(0) > 3 and codes.count(2) > 10, codes
