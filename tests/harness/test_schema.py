"""The schema module is the one list of fields: the JSON, the ORM tables, the frames and the tables
all follow it, old documents upgrade through its chain, and the fingerprint hashes what it did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from store_helpers import write_levels

from k2bench.errors import UserError
from k2bench.harness.cli import main
from k2bench.harness.measure import catalogue
from k2bench.harness.record import runjson, schema
from k2bench.harness.record.fingerprint import fingerprint
from k2bench.harness.store import Store, models

FIXTURE = Path(__file__).parent / "fixtures" / "run_small.json"
ANALYSIS_FIXTURES = Path(__file__).parents[1] / "analysis" / "fixtures"

# Columns the store keeps for itself, beside the schema's fields.
BOOKKEEPING = {
    "runs": {"id", "writer_host", "writer_pid", "writer_start", "updated_at", "heartbeat_at"},
    "points": {"id", "run_id", "created_at"},
    "requests": {"id", "point_id", "run_id", "n_tokens", "token_deltas"},
}


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'schema.db'}"


@pytest.fixture
def store(url):
    with Store.open(url) as s:
        yield s


def _schema_columns(fields) -> set[str]:
    return {c for s in fields for c in s.columns()}


@pytest.mark.parametrize("table,fields", [("runs", schema.RUN), ("points", schema.POINT),
                                          ("requests", schema.REQUEST)])
def test_orm_tables_are_the_schema_fields_plus_bookkeeping(table, fields):
    cols = models.Base.metadata.tables[table].columns
    assert set(cols.keys()) == _schema_columns(fields) | BOOKKEEPING[table]
    for s in fields:
        for name in s.columns():
            assert cols[name].nullable == (s.nullable or s.base == "stats"), name


def test_stat_groups_are_one_float_column_per_statistic():
    cols = models.Base.metadata.tables["points"].columns
    assert {"ttft_ms_p99_9", "e2el_ms_mean", "interactivity_p90"} <= set(cols.keys())
    assert "interactivity_mean" not in cols  # interactivity has only median, p90, p99


def test_exported_json_carries_exactly_the_schema_fields(url, store):
    run_id = write_levels(url, [4])
    doc = store.export_run(run_id, include_requests=True)
    assert doc["schema"] == runjson.schema_name()
    assert list(doc["run"]) == [s.name for s in schema.RUN]
    assert all(list(p) == [s.name for s in schema.POINT] for p in doc["points"])
    assert all(list(r) == [s.name for s in schema.REQUEST] for r in doc["requests"])
    # and it reads back as it was written
    again = store.export_run(store.import_run(doc), include_requests=True)
    assert again["points"] == doc["points"] and again["requests"] == doc["requests"]


def test_frames_carry_the_schema_columns_and_every_catalogue_metric(url, store):
    write_levels(url, [2, 4])
    df = store.points_frame()
    assert list(df.columns) == ["run_id", *schema.RUN_SUMMARY_FIELDS, *schema.POINT_COLUMNS]
    assert {m.column for m in catalogue.CATALOGUE} <= set(df.columns)
    assert len(df) == 2


def test_catalogue_sample_rules_are_known_and_gate_metrics_have_one():
    for m in catalogue.CATALOGUE:
        assert m.sample is None or m.sample in catalogue.SAMPLE_RULES, m.column
    # energy is measured per window, never per request: J/token is judged on trials and history alone
    window_only = {"j_per_token", "spec_accept_len", "spec_accept_rate"}  # and so are the speculation counters
    assert all(m.sample for m in catalogue.GATE_METRICS if m.column not in window_only)
    assert {m.column for m in catalogue.GATE_METRICS if not m.sample} == window_only


def test_fingerprint_fields_hash_as_the_committed_fixtures_recorded():
    """Fixture fingerprints were written by an earlier k2bench: the derived field list must not move them."""
    runs = [json.loads(FIXTURE.read_text())["run"]]
    for path in sorted(ANALYSIS_FIXTURES.glob("*.json")):
        runs += [d["run"] for d in json.loads(path.read_text())["runs"]]
    assert len(runs) > 5
    for run in runs:
        assert fingerprint(run) == run["fingerprint"]
    assert schema.FINGERPRINT_FIELDS == ("engine", "engine_version", "engine_flags", "model", "precision",
                                         "hardware", "num_gpus", "tp", "workload", "isl", "osl", "range_ratio",
                                         "workload_def", "arrival")


def test_show_prints_the_catalogue_table_metrics_and_labelled_level_fields(url, capsys):
    run_id = write_levels(url, [4])
    assert main(["show", str(run_id), "--db", url]) == 0
    out = capsys.readouterr().out
    for header in [m.header for m in catalogue.TABLE_METRICS] + [f.header for f in catalogue.LEVEL_TABLE_FIELDS]:
        assert header in out



def test_presentation_lives_in_the_catalogue_alone():
    """The schema keeps types, checks and columns; every header and decimal a per-level table shows is
    the catalogue's, and every field it presents is a real column."""
    import dataclasses

    assert {f.name for f in dataclasses.fields(schema.Spec)}.isdisjoint({"label", "short", "unit", "decimals"})
    columns = set(schema.POINT_COLUMNS) | {s.name for s in schema.RUN} | {"run_id"}
    for f in catalogue.LEVEL_TABLE_FIELDS:
        assert f.column in schema.POINT_COLUMNS
    for m in catalogue.CATALOGUE:
        assert m.column in columns
    from rich.console import Console

    from k2bench.harness.commands.runs import points_table

    point = {"concurrency": 4, "trial": 0, "num_prompts": 8, "completed": 8, "failed": 0, "osl_mismatches": 2,
             "duration_s": 12.345, "valid": False, "tput_per_gpu": 1234.5}
    console = Console(width=400, record=True)
    console.print(points_table([point]))
    text = console.export_text()
    for f in ("concurrency", "duration_s", "failed", "osl_mismatches", "valid"):
        assert catalogue.FIELDS[f].header in text
    assert "duration s" in text and "12.3" in text and "12.345" not in text  # the catalogue's 1 decimal


# ---------------------------------------------------------------- versions


def _bump_to(monkeypatch, version: int, upgrades: dict) -> None:
    monkeypatch.setattr(schema, "SCHEMA_VERSION", version)
    monkeypatch.setattr(schema, "UPGRADES", upgrades)


def test_a_future_bump_upgrades_old_files_through_the_chain(monkeypatch, store):
    calls = []

    def update_to_2(doc: dict) -> dict:
        calls.append(2)
        for p in doc["points"]:
            p["extra"] = {**(p.get("extra") or {}), "seen_by": ["update_to_2"]}
        return doc

    def update_to_3(doc: dict) -> dict:
        calls.append(3)
        for p in doc["points"]:
            p["extra"]["seen_by"].append("update_to_3")
        return doc

    _bump_to(monkeypatch, 3, {1: update_to_2, 2: update_to_3})
    original = json.loads(FIXTURE.read_text())
    before = json.dumps(original, sort_keys=True)
    doc = runjson.load_doc(FIXTURE)
    assert calls == [2, 3]
    assert doc["schema"] == "k2bench.run/3"
    assert all(p["extra"]["seen_by"] == ["update_to_2", "update_to_3"] for p in doc["points"])
    assert json.dumps(original, sort_keys=True) == before  # the caller's document is not modified
    exported = store.export_run(store.import_run(original))
    assert exported["schema"] == "k2bench.run/3"
    assert exported["points"][0]["extra"] == {"seen_by": ["update_to_2", "update_to_3"]}


def test_a_file_from_a_newer_k2bench_is_a_clear_error(tmp_path):
    doc = json.loads(FIXTURE.read_text())
    doc["schema"] = f"k2bench.run/{schema.SCHEMA_VERSION + 1}"
    path = tmp_path / "new.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"new\.json: schema: 'k2bench.run/\d+' was written by a newer k2bench"):
        runjson.load_doc(path)


@pytest.mark.parametrize("name", ["k2bench.run/0", "k2bench.run/x", "other/1", None])
def test_an_unknown_schema_name_is_refused(name):
    doc = json.loads(FIXTURE.read_text())
    doc["schema"] = name
    with pytest.raises(UserError, match=f"schema: expected '{runjson.schema_name()}'"):
        runjson.validate_doc(doc)


def test_errors_still_name_the_field_by_its_path():
    doc = json.loads(FIXTURE.read_text())
    doc["points"][1]["ttft_ms"]["p99"] = "slow"
    with pytest.raises(UserError, match=r"^points\[1\]\.ttft_ms\.p99: expected a finite number"):
        runjson.validate_doc(doc)
    doc = json.loads(FIXTURE.read_text())
    doc["points"][0]["max_runing"] = 3
    with pytest.raises(UserError, match=r"^points\[0\]\.max_runing: unknown field"):
        runjson.validate_doc(doc)


def test_workload_definition_enters_the_fingerprint_only_when_set():
    """A run of random fixed-length prompts keeps the fingerprint it had before workload_def existed; a
    definition (dataset, prefix, seed) makes runs with different definitions incomparable."""
    base = {"engine": "vllm", "model": "m", "num_gpus": 1, "workload": "w", "isl": 8, "osl": 4, "range_ratio": 1.0}
    old = dict(base)
    assert fingerprint({**base, "workload_def": None}) == fingerprint(old)
    a = fingerprint({**base, "workload_def": {"prefix_len": 4, "seed": 0}})
    b = fingerprint({**base, "workload_def": {"prefix_len": 4, "seed": 1}})
    assert len({a, b, fingerprint(old)}) == 3
