"""A dead sweep is recognisable from any host, and takes its server with it.

A run's heartbeat: readers on any host show a `running` run whose writer stopped beating as partial
(SQLite, and PostgreSQL when K2BENCH_TEST_PG_URL is set); time is moved on the store's clock, never
waited for. A sweep killed with SIGKILL (no cleanup runs): its launched server goes with it, and its
run reads as partial on its host at once and from another host once its heartbeat is older than the
lease (Linux only: /proc, prctl)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from store_helpers import run_meta

from k2bench.errors import UserError
from k2bench.harness.run.sweep import SweepConfig, run_sweep
from k2bench.harness.servers import launch
from k2bench.harness.store import Store, liveness
from k2bench.harness.store.heartbeat import Heartbeat
from k2bench.workloads.loader import Workload

LEASE = timedelta(seconds=liveness.LEASE_S)


@pytest.fixture
def store(db_url):
    with Store.open(db_url) as s:
        yield s


def ahead(store: Store, by: timedelta):
    """The store's clock moved forward by ``by``."""
    return lambda s: liveness.store_now(s) + by


def test_lease_is_three_beats_and_slack_as_documented() -> None:
    assert liveness.LEASE_S > 3 * liveness.HEARTBEAT_S
    page = " ".join((Path(__file__).parents[2] / "docs" / "store.md").read_text().split())
    assert f"every {liveness.HEARTBEAT_S:g} s" in page and f"older than {liveness.LEASE_S:g} s" in page


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


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux (/proc, prctl)")
SERVER_CMD = "{python} -m k2bench.harness.load.testserver --host {host} --port {port} --ttft-ms 1 --itl-ms 20"


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()  # [0] state, [1] ppid


def _running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")  # a zombie has already exited


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) and fields[1] == str(pid):
            out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _wait_for(what: str, check, proc: subprocess.Popen, bound_s: float = 120.0):
    deadline = time.monotonic() + bound_s
    while not (found := check()):
        assert proc.poll() is None, f"the sweep ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {bound_s:g} s"
        time.sleep(0.05)
    return found


def _runs(db: str) -> list[dict]:
    try:
        with Store.open(db, readonly=True) as store:
            return store.list_runs()
    except UserError:  # not created or not migrated yet
        return []


@linux_only
def test_sigkilled_sweep_leaves_no_server_and_a_run_every_host_sees_dead(db_url, tmp_path, monkeypatch) -> None:
    # many short trials of one level: the run exists after the first, and the sweep is far from done
    argv = [sys.executable, "-m", "k2bench.harness.cli", "sweep", "--server-cmd", SERVER_CMD, "--isl", "8",
            "--osl", "4", "--conc", "1", "--num-prompts", "2", "--warmup", "0", "--trials", "1000",
            "--no-telemetry", "--db", db_url]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = None
    try:
        (run,) = _wait_for("stored run", lambda: _runs(db_url), proc)
        server = _wait_for("server process", lambda: [p for p in _children(proc.pid)
                                                       if "k2bench.harness.load.testserver" in _cmdline(p)], proc)[0]
        assert run["effective_status"] == "running"  # its writer is alive
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    try:
        deadline = time.monotonic() + 30
        while _running(server):
            assert time.monotonic() < deadline, "the launched server outlived its SIGKILLed sweep by 30 s"
            time.sleep(0.05)
    finally:
        if _running(server):  # the bug this test is for: do not leave the orphan behind
            os.kill(server, signal.SIGKILL)
    with Store.open(db_url) as store:
        run = store.get_run(run["id"])
        assert (run["status"], run["effective_status"]) == ("running", "partial")  # same host: the pid check
        monkeypatch.setattr(liveness, "host_id", lambda: "another-host#00000000")  # read from another host
        assert store.get_run(run["id"])["effective_status"] == "running"  # its last beat is recent
        store.clock = ahead(store, timedelta(seconds=liveness.LEASE_S + 5))
        assert store.get_run(run["id"])["effective_status"] == "partial"


def test_a_sweep_beats_while_it_measures(tmp_path, monkeypatch) -> None:
    """The sweep starts the heartbeat with its run and stops it before finishing the run."""
    monkeypatch.setattr(liveness, "HEARTBEAT_S", 0.02)
    beats: list[tuple[int, str]] = []
    real_beat = Store.beat

    def beat(self: Store, run_id: int) -> None:
        real_beat(self, run_id)
        beats.append((run_id, self.get_run(run_id)["status"]))

    monkeypatch.setattr(Store, "beat", beat)
    db = f"sqlite:///{tmp_path}/k.db"
    with launch.from_recipe("testserver", model="m", extra_args=["--ttft-ms", "1", "--itl-ms", "20"],
                            log_dir=tmp_path) as server:
        cfg = SweepConfig(levels=[1, 2], workload=Workload(name="w", isl=8, osl=4), url=server.base_url,
                          num_prompts=4, warmup=0, trials=3, db=db)
        result = run_sweep(cfg)
    count = len(beats)
    time.sleep(0.2)  # ten intervals: a thread left running would beat again
    assert result.status == "complete" and count == len(beats) > 0
    assert {rid for rid, _ in beats} == {result.run_id} and {status for _, status in beats} == {"running"}


@linux_only
def test_parent_death_signal_is_asked_for_from_the_main_thread_only() -> None:
    """The kernel signals when the forking *thread* ends: a server forked from a short-lived thread would
    be killed with that thread, so there no request is made."""
    import threading

    from k2bench.harness.servers.pdeathsig import die_with_parent

    assert callable(die_with_parent())
    from_thread = []
    worker = threading.Thread(target=lambda: from_thread.append(die_with_parent()))
    worker.start()
    worker.join()
    assert from_thread == [None]
