"""Store round trips, migrations, crash safety and concurrent writers (SQLite, and PostgreSQL when
K2BENCH_TEST_PG_URL is set: .ci/run starts one)."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from store_helpers import make_level, run_meta, write_levels

from k2bench.errors import UserError
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.record.fingerprint import fingerprint
from k2bench.harness.record.runjson import validate_point
from k2bench.harness.store import Store, default_db_url
from k2bench.harness.store.upgrade import upgrade_database

HERE = Path(__file__).parent



@pytest.fixture
def store(db_url):
    with Store.open(db_url) as s:
        yield s


def test_write_read_round_trip(store):
    recs = make_level(4, warmup=3, fail_every=5)
    point = summarize_level(recs, concurrency=4, num_gpus=2)
    run_id = store.create_run(run_meta())
    assert store.get_run(run_id)["status"] == "running"
    store.add_point(run_id, point, recs)
    store.finish_run(run_id, "complete")

    run = store.get_run(run_id)
    assert run["status"] == "complete" and run["effective_status"] == "complete"
    assert run["levels"] == 1 and run["finished_at"] is not None
    assert run["fingerprint"] == fingerprint(run_meta())
    assert run["engine_flags"] == {"max_num_seqs": 64} and run["tags"] == {"ci": "yes"}

    doc = store.export_run(run_id)
    # every summary figure survives the columns and back (fields the summary leaves out read as null)
    assert doc["points"] == [validate_point(point)]
    assert {k: doc["points"][0][k] for k in point} == point
    # raw stamps survive exactly, warmups included when asked
    assert store.load_records(run_id, include_warmup=True) == recs
    assert store.load_records(run_id) == [r for r in recs if not r.warmup]
    # re-summarising the stored records gives the stored summary
    assert summarize_level(store.load_records(run_id), concurrency=4, num_gpus=2) == point


def test_frames(store):
    run_id = write_levels(store.url, [4, 8])
    pf = store.points_frame()
    assert list(pf["concurrency"]) == [4, 8]
    assert set(pf["run_id"]) == {run_id}
    assert str(pf["started_at"].dt.tz) == "UTC"
    for col in ("tput_per_gpu", "interactivity_p99", "ttft_ms_p99_9", "e2el_ms_std", "fingerprint", "model"):
        assert col in pf.columns
    assert pf["tpot_ms_median"].notna().all()

    rf = store.requests_frame(run_id, concurrency=8)
    assert len(rf) == 16  # measured only: 2 x concurrency, warmups excluded
    assert rf["send_s"].min() == 0.0
    first = make_level(8, seed=0, warmup=2)[2]  # the first measured request
    assert rf.iloc[0]["ttft_ms"] == pytest.approx((first.token_ns[0] - first.send_ns) / 1e6)

    gaps = store.itl_ms(run_id, 8)
    recs = [r for r in make_level(8, seed=0, warmup=2) if not r.warmup]
    expected = [(b - a) / 1e6 for r in recs for a, b in pairwise(r.token_ns)]
    assert sorted(gaps.tolist()) == pytest.approx(sorted(expected))


def test_list_runs_newest_first_and_filters(store):
    a = write_levels(store.url, [4], meta=run_meta(started_at="2026-01-01T00:00:00Z", commit="aaaa111"))
    b = write_levels(store.url, [4, 8], meta=run_meta(started_at="2026-02-01T00:00:00Z", engine="vllm"))
    runs = store.list_runs()
    assert [r["id"] for r in runs] == [b, a]
    assert [r["levels"] for r in runs] == [2, 1]
    assert [r["id"] for r in store.list_runs(engine="bundled")] == [a]
    assert [r["id"] for r in store.list_runs(commit="aaaa")] == [a]  # prefix
    assert store.list_runs(limit=1)[0]["id"] == b
    with pytest.raises(UserError, match="unknown filter"):
        store.list_runs(colour="red")


def test_unknown_run_is_user_error(store):
    for bad in (999, "nope"):
        with pytest.raises(UserError, match="no run with id"):
            store.get_run(bad)
    with pytest.raises(UserError, match="no run"):
        store.add_point(12345, summarize_level(make_level(4), concurrency=4, num_gpus=1), None)


def test_duplicate_level_rejected(store):
    run_id = store.create_run(run_meta())
    point = summarize_level(make_level(4), concurrency=4, num_gpus=2)
    store.add_point(run_id, point)
    with pytest.raises(UserError, match="already has a level"):
        store.add_point(run_id, point)
    store.add_point(run_id, {**point, "trial": 1})  # another trial of the same level is fine
    assert store.get_run(run_id)["levels"] == 2


def test_create_run_rejects_unknown_and_bad_fields(store):
    with pytest.raises(UserError, match=r"run\.colour: unknown field"):
        store.create_run(run_meta(colour="red"))
    with pytest.raises(UserError, match=r"run\.num_gpus"):
        store.create_run(run_meta(num_gpus=0))
    with pytest.raises(UserError, match=r"run\.model: missing"):
        meta = run_meta()
        del meta["model"]
        store.create_run(meta)
    assert store.list_runs() == []


def test_import_export_round_trip(store):
    src = write_levels(store.url, [4, 8, 16])
    doc = store.export_run(src, include_requests=True)
    new = store.import_run(copy.deepcopy(doc))
    assert new != src
    again = store.export_run(new, include_requests=True)
    doc["run"]["id"] = new
    assert again == doc
    assert store.load_records(new, include_warmup=True) == store.load_records(src, include_warmup=True)


def test_bad_import_names_field_and_writes_nothing(store):
    src = write_levels(store.url, [4, 8])
    doc = store.export_run(src, include_requests=True)
    before = len(store.list_runs())
    bad = copy.deepcopy(doc)
    bad["points"][1]["ttft_ms"]["p99"] = "fast"
    with pytest.raises(UserError, match=r"points\[1\]\.ttft_ms\.p99"):
        store.import_run(bad)
    bad = copy.deepcopy(doc)
    bad["requests"][3]["send_ns"] = 1.5
    with pytest.raises(UserError, match=r"requests\[3\]\.send_ns"):
        store.import_run(bad)
    bad = copy.deepcopy(doc)
    bad["run"]["status"] = "great"
    with pytest.raises(UserError, match=r"run\.status"):
        store.import_run(bad)
    assert len(store.list_runs()) == before


def test_failed_import_mid_write_rolls_back(store, monkeypatch):
    """A database error after the run row was written leaves no trace (one transaction)."""
    from k2bench.harness.store import store as store_mod

    doc = store.export_run(write_levels(store.url, [4, 8]), include_requests=True)
    calls = {"n": 0}
    real = store_mod._json_request_row

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("disk on fire")
        return real(*args)

    monkeypatch.setattr(store_mod, "_json_request_row", flaky)
    with pytest.raises(RuntimeError):
        store.import_run(doc)
    assert len(store.list_runs()) == 1
    assert len(store.points_frame()) == 2


def test_change_points_replace(store):
    rows = [{"metric": "tput_per_gpu", "concurrency": 64, "run_id": 3, "commit": "abc", "detected_at":
             "2026-03-01T00:00:00Z", "mean_before": 100.0, "mean_after": 90.0, "rel_change": -0.1, "p_value": 0.001}]
    store.replace_change_points("fp1", "main", rows)
    store.replace_change_points("fp1", "main", rows + [{**rows[0], "concurrency": 128}])
    store.replace_change_points("fp2", "main", rows)
    df = store.change_points_frame(fingerprint="fp1", branch="main")
    assert sorted(df["concurrency"]) == [64, 128]
    assert len(store.change_points_frame()) == 3
    store.replace_change_points("fp1", "main", [])
    assert len(store.change_points_frame(fingerprint="fp1")) == 0


def test_migrations_match_models(db_url):
    """A fresh database migrated by Alembic has exactly the schema the ORM models describe."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from k2bench.harness.store.models import Base

    Store.open(db_url).close()
    engine = create_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        tables = set(inspect(conn).get_table_names())
    engine.dispose()
    assert diff == []
    assert {"runs", "points", "requests", "change_points", "alembic_version"} <= tables
    Store.open(db_url).close()  # opening again at head is a no-op


def test_readonly(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.raises(UserError, match="no k2bench database"):
        Store.open(url, readonly=True)
    write_levels(url, [4])
    with Store.open(url, readonly=True) as ro:
        assert len(ro.list_runs()) == 1
        with pytest.raises(UserError, match="read-only"):
            ro.create_run(run_meta())


def test_default_url(monkeypatch, tmp_path):
    monkeypatch.delenv("K2BENCH_DB", raising=False)
    assert default_db_url() == "sqlite:///results/k2bench.db"
    monkeypatch.setenv("K2BENCH_DB", f"sqlite:///{tmp_path / 'x.db'}")
    assert default_db_url().endswith("x.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("K2BENCH_DB")
    Store.open().close()
    assert (tmp_path / "results" / "k2bench.db").exists()


@pytest.mark.parametrize("url, words", [
    ("not a url", "not a database URL"),
    ("nosuchdb://x/y", "unknown database kind"),
    ("sqlite:////proc/forbidden/dir/k.db", "cannot"),
])
def test_bad_urls_are_one_line_user_errors(url, words):
    with pytest.raises(UserError, match=words) as info:
        Store.open(url)
    assert "\n" not in str(info.value)


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(HERE)!r})\n{code}"])


def test_killed_sweep_keeps_finished_levels(db_url, tmp_path):
    """A writer killed (SIGKILL) between levels leaves its finished levels, and reads as partial."""
    flag = tmp_path / "two-levels-done"
    proc = _child(
        "import time, pathlib\n"
        "from store_helpers import *\n"
        "from k2bench.harness.store import Store\n"
        "from k2bench.harness.measure.metrics import summarize_level\n"
        f"s = Store.open({db_url!r})\n"
        "rid = s.create_run(run_meta())\n"
        "for c in (4, 8):\n"
        "    r = make_level(c)\n"
        "    s.add_point(rid, summarize_level(r, concurrency=c, num_gpus=2), r)\n"
        f"pathlib.Path({str(flag)!r}).write_text(str(rid))\n"
        "time.sleep(60)\n"
    )
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "writer did not get going"
            time.sleep(0.05)
        with Store.open(db_url) as s:
            assert s.get_run(int(flag.read_text()))["effective_status"] == "running"  # writer alive
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with Store.open(db_url) as s:
        run = s.get_run(int(flag.read_text()))
        assert run["status"] == "running" and run["effective_status"] == "partial"
        assert run["levels"] == 2
        assert list(s.points_frame()["concurrency"]) == [4, 8]
        assert len(s.requests_frame(run["id"])) == 8 + 16


def test_two_processes_writing_at_once_lose_nothing(db_url, tmp_path):
    Store.open(db_url).close()  # schema first, so both children race only on data
    levels = [1, 2, 4, 8, 16, 32, 64]
    go = tmp_path / "go"
    procs = [
        _child(f"from store_helpers import write_levels\n"
               f"write_levels({db_url!r}, {levels!r}, seed={seed}, ready={str(tmp_path / f'ready{seed}')!r}, "
               f"go={str(go)!r})")
        for seed in (1, 2)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{seed}").exists() for seed in (1, 2)):
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.02)
    go.touch()  # both writers start together
    codes = [p.wait(timeout=240) for p in procs]
    assert codes == [0, 0]
    with Store.open(db_url) as s:
        runs = s.list_runs()
        assert len(runs) == 2 and all(r["levels"] == len(levels) and r["status"] == "complete" for r in runs)
        for r in runs:
            assert len(s.requests_frame(r["id"])) == sum(2 * c for c in levels)
            assert s.load_records(r["id"], include_warmup=True) == [
                rec for c in levels for rec in make_level(c, seed=_seed_of(s, r["id"]), warmup=2)]


def _seed_of(store: Store, run_id: int) -> int:
    """Which child wrote a run: seeds shift send stamps by seed seconds (see make_level)."""
    first = store.load_records(run_id, include_warmup=True)[0]
    return (first.send_ns - 10**12) // 10**9


def test_newer_schema_is_a_clear_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'future.db'}"
    Store.open(url).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(UserError, match="9999.*newer k2bench"):
        Store.open(url)
    with pytest.raises(UserError, match="9999"):
        Store.open(url, readonly=True)


def test_refused_open_disposes_its_engines(tmp_path, monkeypatch):
    from sqlalchemy.engine import Engine

    url = f"sqlite:///{tmp_path / 'future.db'}"
    Store.open(url).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    disposed: list[Engine] = []
    real_dispose = Engine.dispose
    monkeypatch.setattr(Engine, "dispose", lambda self, *a, **k: (disposed.append(self), real_dispose(self, *a, **k)))
    with pytest.raises(UserError, match="newer k2bench"):
        Store.open(url)  # file SQLite: a read and a write engine, both must be let go
    assert len(set(disposed)) == 2


@pytest.mark.parametrize("stamps", [
    [],
    [5],
    [1_000, 1_000, 21_000_000, 41_000_123],  # a repeated stamp (two messages in one read)
    [10**12 + 7 * 10**9, 10**12 + 7 * 10**9 + 1],  # a gap too long for 32 bits
    [10**12 - 500, 10**12 + 5],  # a stamp before send (clock oddity): kept, signed 64-bit path
])
def test_stamp_codec_round_trips_exactly(stamps):
    from k2bench.harness.store.codec import decode_deltas, decode_stamps, encode_stamps

    send = 10**12
    blob = encode_stamps(send, stamps)
    assert decode_stamps(send, blob) == stamps
    expected = [b - a for a, b in pairwise([send, *stamps])]
    assert decode_deltas(blob).tolist() == expected


def test_upgrade_from_first_revision_keeps_data(db_url):
    """A database created by revision 0001 (before runs.writer_start) migrates on a read-write open
    (SQLite) or through `k2bench db upgrade` (PostgreSQL), data intact. Every revision: test_store_migrations."""
    from alembic import command

    from k2bench.harness.store import db as dbmod

    if db_url.startswith("sqlite:///"):
        Path(db_url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(db_url)
    with engine.begin() as conn:
        command.upgrade(dbmod.alembic_config(conn), "0001")
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO runs (id, engine, model, num_gpus, fingerprint, trials, status, started_at, writer_host, "
            "writer_pid) VALUES (7, 'vllm', 'old-model', 8, 'fp', 1, 'complete', '2026-01-02 03:04:05', 'h', 1)"))
        conn.execute(text(
            "INSERT INTO points (run_id, concurrency, trial, num_prompts, completed, failed, osl_mismatches, "
            "tput_per_gpu) VALUES (7, 64, 0, 640, 640, 0, 0, 1234.5)"))
        assert dbmod.current_revision(conn) == "0001"
    if not db_url.startswith("sqlite"):
        with pytest.raises(UserError, match="does not copy a PostgreSQL database.*pg_dump.*k2bench db upgrade"):
            Store.open(db_url)
        assert upgrade_database(db_url) == "0001"
    with Store.open(db_url) as s:
        run = s.get_run(7)
        assert (run["engine"], run["model"], run["levels"]) == ("vllm", "old-model", 1)
        assert run["started_at"] == "2026-01-02T03:04:05.000000Z"
        assert s.export_run(7)["points"][0]["tput_per_gpu"] == 1234.5
    with engine.connect() as conn:
        assert dbmod.current_revision(conn) == dbmod.head_revision() != "0001"
        assert "writer_start" in {c["name"] for c in inspect(conn).get_columns("runs")}
    engine.dispose()


def test_recycled_pid_is_not_a_live_writer(store):
    from k2bench.harness.store.liveness import host_id, process_start

    run_id = store.create_run(run_meta())
    assert store.get_run(run_id)["effective_status"] == "running"  # this very process
    engine = create_engine(store.url)
    with engine.begin() as conn:  # same pid, but a process that started at another time
        conn.execute(text("UPDATE runs SET writer_start = :t WHERE id = :i"),
                     {"t": process_start(os.getpid()) + 1, "i": run_id})
    assert store.get_run(run_id)["effective_status"] == "partial"
    with engine.begin() as conn:  # another host: cannot judge, trust the record
        conn.execute(text("UPDATE runs SET writer_host = :h WHERE id = :i"), {"h": host_id() + "x", "i": run_id})
    engine.dispose()
    assert store.get_run(run_id)["effective_status"] == "running"


def test_in_memory_sqlite_works():
    with Store.open("sqlite://") as s:
        run_id = write_levels_into(s)
        assert s.get_run(run_id)["levels"] == 1


def write_levels_into(store: Store) -> int:
    recs = make_level(4)
    run_id = store.create_run(run_meta())
    store.add_point(run_id, summarize_level(recs, concurrency=4, num_gpus=2), recs)
    return run_id


def test_frames_of_an_empty_store_have_their_columns(store):
    assert len(store.points_frame()) == 0 and "tput_per_gpu" in store.points_frame().columns
    run_id = store.create_run(run_meta())
    assert len(store.requests_frame(run_id)) == 0 and "ttft_ms" in store.requests_frame(run_id).columns
    assert len(store.change_points_frame()) == 0 and "p_value" in store.change_points_frame().columns
    assert store.itl_ms(run_id, 4).size == 0
