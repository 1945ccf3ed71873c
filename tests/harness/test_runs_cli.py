"""`k2bench runs / show / export / import` through the real CLI entry point."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from store_helpers import run_meta, write_levels

from k2bench.harness.cli import main
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.record.runjson import validate_doc
from k2bench.harness.store import Store

FIXTURE = Path(__file__).parent / "fixtures" / "run_small.json"


@pytest.fixture
def db(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def _records_of(doc: dict, concurrency: int) -> list[RequestRecord]:
    out = []
    for r in doc["requests"]:
        if r["concurrency"] != concurrency:
            continue
        stamps, t = [], r["send_ns"]
        for d in r["token_delta_ns"]:
            t += d
            stamps.append(t)
        out.append(RequestRecord(
            index=r["index"], concurrency=r["concurrency"], warmup=r["warmup"],
            requested_input_tokens=r["requested_input_tokens"], requested_output_tokens=r["requested_output_tokens"],
            send_ns=r["send_ns"], token_ns=stamps, end_ns=r["end_ns"], prompt_tokens=r["prompt_tokens"],
            output_tokens=r["output_tokens"], success=r["success"], error=r["error"]))
    return out


def test_fixture_points_agree_with_its_raw_requests():
    """The committed fixture is self-consistent: its summaries re-derive from its stamps. It is a version-1
    document: the figures added since (steady state) are derived too, but it does not carry them."""
    doc = json.loads(FIXTURE.read_text())
    for p in doc["points"]:
        again = summarize_level(_records_of(doc, p["concurrency"]), concurrency=p["concurrency"],
                                num_gpus=doc["run"]["num_gpus"])
        assert {k: again[k] for k in p} == p
        assert again["steady"]["slices"]["t_s"] == [0.0]  # each level lasts well under a second


def test_import_export_round_trip_via_cli(db, tmp_path, capsys):
    assert main(["import", str(FIXTURE), "--db", db]) == 0
    assert "as run 1" in capsys.readouterr().out
    out = tmp_path / "out" / "again.json"
    assert main(["export", "1", "--json", str(out), "--requests", "--db", db]) == 0
    fixture = json.loads(FIXTURE.read_text())
    want = _as_current(fixture)
    assert json.loads(out.read_text()) == want
    # without --requests the document has no "requests" key but the same points
    assert main(["export", "1", "--json", str(out), "--db", db]) == 0
    slim = json.loads(out.read_text())
    assert "requests" not in slim and slim["points"] == want["points"]


def _as_current(fixture: dict) -> dict:
    """The fixture as this k2bench writes it (current schema version; fields added since are null),
    checked to keep every value the fixture has."""
    doc = validate_doc(fixture)
    for part in ("run", "points", "requests"):
        objs = [doc[part]] if part == "run" else doc[part]
        given = [fixture[part]] if part == "run" else fixture[part]
        assert len(objs) == len(given)
        for obj, old in zip(objs, given, strict=True):
            assert {k: obj[k] for k in old} == old
    return doc


def test_show_prints_metadata_and_levels(db, capsys):
    main(["import", str(FIXTURE), "--db", db])
    capsys.readouterr()
    assert main(["show", "1", "--db", db]) == 0
    out = capsys.readouterr().out
    doc = json.loads(FIXTURE.read_text())
    for text in ("tiny-k2", "abc1234def", "1k1k", doc["run"]["fingerprint"], "tok/s/GPU", "tok/s/user", "TTFT p99"):
        assert text in out
    # the conc-4 level has failures: shown as failed/num_prompts, with the first error message
    failed = [r for r in doc["requests"] if r["concurrency"] == 4 and not r["warmup"] and not r["success"]]
    assert failed and f"{len(failed)}/8" in out and failed[0]["error"] in out
    # tok/s/user of conc 8, computed here from the raw stamps: 1000 / median TPOT
    recs = [r for r in _records_of(doc, 8) if r.success and not r.warmup]
    tpots = [((r.token_ns[-1] - r.token_ns[0]) / 1e6) / (r.output_tokens - 1) for r in recs]
    assert f"{1000 / statistics.median(tpots):,.1f}" in out


def test_runs_lists_newest_first(db, capsys):
    old = write_levels(db, [4], meta=run_meta(started_at="2026-01-01T08:00:00Z", commit="1111111aaaa"))
    new = write_levels(db, [4, 8], meta=run_meta(started_at="2026-03-01T09:30:00Z", commit="2222222bbbb",
                                                 engine="vllm"))
    capsys.readouterr()
    assert main(["runs", "--db", db]) == 0
    out = capsys.readouterr().out
    assert out.index("2026-03-01 09:30") < out.index("2026-01-01 08:00")
    assert "2222222bbb" in out and "vllm" in out and "complete" in out
    assert main(["runs", "--engine", "bundled", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "1111111aaa" in out and "2222222bbb" not in out
    assert (old, new) == (1, 2)


def test_dead_writer_shows_partial(db, capsys):
    """A run left "running" by a process that no longer exists is listed as partial."""
    import subprocess
    import sys

    with Store.open(db) as store:
        run_id = store.create_run(run_meta())
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    from sqlalchemy import create_engine, text

    engine = create_engine(db)
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET writer_pid = :p WHERE id = :i"), {"p": int(gone.stdout), "i": run_id})
    engine.dispose()
    assert main(["runs", "--db", db]) == 0
    assert "partial" in capsys.readouterr().out
    assert main(["show", str(run_id), "--db", db]) == 0
    assert "partial (recorded running" in capsys.readouterr().out


def test_user_errors_are_one_line(db, tmp_path, capsys):
    write_levels(db, [4])
    capsys.readouterr()
    cases = [
        (["show", "42", "--db", db], "no run with id"),
        (["export", "abc", "--json", str(tmp_path / "x.json"), "--db", db], "no run with id"),
        (["runs", "--db", "not-a-url"], "not a database URL"),
        (["runs", "--db", "nosuch://x"], "unknown database kind"),
        (["import", str(tmp_path / "missing.json"), "--db", db], "cannot read"),
    ]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err


def test_bad_import_file_writes_nothing(db, tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(FIXTURE.read_text())
    doc = json.loads(FIXTURE.read_text())
    doc["points"][2]["tpot_ms"]["median"] = "slow"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    notjson = tmp_path / "broken.json"
    notjson.write_text("{ nope")
    assert main(["import", str(good), str(bad), "--db", db]) == 2
    assert "points[2].tpot_ms.median" in capsys.readouterr().err
    assert main(["import", str(notjson), "--db", db]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    with Store.open(db) as store:
        assert store.list_runs() == []  # the good file was not imported either: all checked first


def test_import_refuses_non_finite_numbers_in_one_line(db, tmp_path, capsys):
    """Python's json reads Infinity/NaN; stored, such a run could never be exported again (strict JSON)."""
    text = FIXTURE.read_text()
    doc = json.loads(text)
    p99 = doc["points"][0]["ttft_ms"]["p99"]
    bad = tmp_path / "inf.json"
    bad.write_text(text.replace(f'"p99": {json.dumps(p99)}', '"p99": Infinity', 1))
    assert json.loads(bad.read_text())["points"][0]["ttft_ms"]["p99"] == float("inf")
    assert main(["import", str(bad), "--db", db]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and r"points[0].ttft_ms.p99" in err and "finite" in err
