"""A run's heartbeat: readers on any host show a `running` run whose writer stopped beating as partial
(SQLite, and PostgreSQL when K2BENCH_TEST_PG_URL is set). Time is moved on the store's clock, never
waited for."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, text
from store_helpers import run_meta

from k2bench.harness.store import Store, liveness
from k2bench.harness.store.heartbeat import Heartbeat

PG_URL = os.environ.get("K2BENCH_TEST_PG_URL")
LEASE = timedelta(seconds=liveness.LEASE_S)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'k2bench.db'}"
    if not PG_URL:
        pytest.skip("K2BENCH_TEST_PG_URL is not set (bash .ci/run starts a PostgreSQL)")
    engine = create_engine(PG_URL)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
    return PG_URL


@pytest.fixture
def store(db_url):
    with Store.open(db_url) as s:
        yield s


def ahead(store: Store, by: timedelta):
    """The store's clock moved forward by ``by``."""
    return lambda s: liveness.store_now(s) + by


def test_lease_is_three_beats_and_slack() -> None:
    assert liveness.LEASE_S > 3 * liveness.HEARTBEAT_S


def test_a_run_whose_heartbeat_stopped_reads_partial_from_another_host(store, monkeypatch) -> None:
    run_id = store.create_run(run_meta())
    monkeypatch.setattr(liveness, "host_id", lambda: "another-host#00000000")  # the pid check cannot judge
    assert store.get_run(run_id)["effective_status"] == "running"
    store.clock = ahead(store, LEASE - timedelta(seconds=5))
    assert store.get_run(run_id)["effective_status"] == "running"  # within the lease
    store.clock = ahead(store, LEASE + timedelta(seconds=5))
    assert store.get_run(run_id)["effective_status"] == "partial"
    (listed,) = store.list_runs()
    assert (listed["status"], listed["effective_status"]) == ("running", "partial")
    store.beat(run_id)  # a beat on the (moved) clock: alive again
    assert store.get_run(run_id)["effective_status"] == "running"
    store.finish_run(run_id, "complete")  # a finished run is never judged by its heartbeat
    store.clock = ahead(store, 10 * LEASE)
    assert store.get_run(run_id)["effective_status"] == "complete"


def test_a_run_without_heartbeat_is_not_judged_by_it(store, monkeypatch) -> None:
    """Rows from before the heartbeat column (NULL) keep the old rule: from another host, trust them."""
    run_id = store.create_run(run_meta())
    engine = create_engine(store.url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET heartbeat_at = NULL WHERE id = :i"), {"i": run_id})
    engine.dispose()
    monkeypatch.setattr(liveness, "host_id", lambda: "another-host#00000000")
    store.clock = ahead(store, 10 * LEASE)
    assert store.get_run(run_id)["effective_status"] == "running"


def test_heartbeat_thread_refreshes_the_run_and_stops(store) -> None:
    run_id = store.create_run(run_meta())
    first = _heartbeat_at(store, run_id)
    with Heartbeat(store, run_id, interval_s=0.05) as hb:
        deadline = time.monotonic() + 60
        while _heartbeat_at(store, run_id) == first:
            assert time.monotonic() < deadline, "no beat within 60 s"
            time.sleep(0.05)
    assert hb._thread is not None and not hb._thread.is_alive()
    assert _heartbeat_at(store, run_id) > first


def test_in_memory_store_gets_no_thread() -> None:
    with Store.open("sqlite://") as s, Heartbeat(s, s.create_run(run_meta()), interval_s=0.01) as hb:
        assert hb._thread is None


def test_a_failing_beat_does_not_end_the_thread(store, monkeypatch) -> None:
    run_id = store.create_run(run_meta())
    calls = []

    def flaky(rid: int) -> None:
        calls.append(rid)
        if len(calls) == 1:
            raise OSError("database unreachable")

    monkeypatch.setattr(store, "beat", flaky)
    with Heartbeat(store, run_id, interval_s=0.02):
        deadline = time.monotonic() + 60
        while len(calls) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert calls[:3] == [run_id] * 3


def _heartbeat_at(store: Store, run_id: int):
    engine = create_engine(store.url)
    with engine.connect() as conn:
        value = conn.execute(text("SELECT heartbeat_at FROM runs WHERE id = :i"), {"i": run_id}).scalar_one()
    engine.dispose()
    return value
