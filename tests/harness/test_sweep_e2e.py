"""`k2bench sweep` end to end against the test server (launched by recipe or attached by URL)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys

import pytest

from k2bench.errors import UserError
from k2bench.harness.cli import main
from k2bench.harness.record.runjson import schema_name
from k2bench.harness.run.sweep import LevelEvents, SweepConfig, run_sweep
from k2bench.harness.servers import launch
from k2bench.harness.store import Store
from k2bench.net import free_port
from k2bench.workloads.loader import Workload


@contextlib.contextmanager
def serving(tmp_path, *args: str, api_key: str | None = None):
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=list(args), log_dir=tmp_path,
                            api_key=api_key) as s:
        yield s.base_url


def test_sweep_launches_measures_stores_and_writes_json(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the server log goes to ./results/logs
    db = f"sqlite:///{tmp_path}/k.db"
    out = tmp_path / "run.json"
    code = main(["sweep", "--engine", "testserver", "--server-args", "--ttft-ms 100 --itl-ms 10",
                 "--isl", "64", "--osl", "16", "--conc", "2,4", "--num-prompts", "8", "--warmup", "2",
                 "--db", db, "--json", str(out), "--tag", "purpose=test", "--tag", "k=v=w", "--commit", "abc123"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "tok/s/GPU" in captured.out and "TTFT p50" in captured.out
    doc = json.loads(out.read_text())
    assert doc["schema"] == schema_name()  # the version this k2bench writes
    run = doc["run"]
    assert run["status"] == "complete" and run["engine"] == "testserver" and run["commit"] == "abc123"
    assert run["tags"] == {"purpose": "test", "k": "v=w"}
    assert "--ttft-ms 100" in run["server_command"] and run["engine_flags"] == ["--ttft-ms", "100", "--itl-ms", "10"]
    assert run["engine_version"] and (run["isl"], run["osl"], run["num_gpus"]) == (64, 16, 1)
    assert [p["concurrency"] for p in doc["points"]] == [2, 4]
    for p in doc["points"]:
        assert p["completed"] == 8 and p["failed"] == 0
        assert p["ttft_ms"]["median"] == pytest.approx(100, rel=0.1)
        assert p["tpot_ms"]["median"] == pytest.approx(10, rel=0.1)
        assert p["input_tokens"] == 8 * 64 and p["output_tokens"] == 8 * 16
    with Store.open(db, readonly=True) as store:
        reqs = store.requests_frame(run["id"])
        assert len(reqs) == 16 and reqs["success"].all()
    assert (tmp_path / run["extra"]["server_log"]).read_text().startswith("# k2bench launch")
    assert run["extra"]["versions"]["python"] == sys.version.split()[0] and run["extra"]["versions"]["k2bench"]


def test_trials_are_stored_as_trial_numbers(tmp_path) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "1") as url:
        cfg = SweepConfig(levels=[1, 2], workload=Workload(name="w", isl=8, osl=4), url=url, num_prompts=3,
                          warmup=1, trials=2, db=db, gpus=2)
        result = run_sweep(cfg)
    assert result.status == "complete"
    with Store.open(db, readonly=True) as store:
        frame = store.points_frame([result.run_id])
    assert sorted(zip(frame["concurrency"], frame["trial"], strict=True)) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert set(frame["num_gpus"]) == {2} and set(frame["engine"]) == {"external"}
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    assert result.meta["commit"] == head  # default: git HEAD of the checkout the sweep runs in


def test_interrupted_sweep_keeps_finished_levels_as_partial(tmp_path) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    out = tmp_path / "partial.json"

    def stop_after_first(point: dict) -> None:
        raise KeyboardInterrupt

    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "1") as url:
        cfg = SweepConfig(levels=[1, 2, 4], workload=Workload(name="w", isl=8, osl=4), url=url, num_prompts=2,
                          warmup=0, db=db, json_path=str(out))
        result = run_sweep(cfg, LevelEvents(level_done=stop_after_first))
    assert result.exit_code == 130 and result.status == "partial" and len(result.points) == 1
    assert result.planned == 3
    doc = json.loads(out.read_text())
    assert doc["run"]["status"] == "partial" and [p["concurrency"] for p in doc["points"]] == [1]
    with Store.open(db, readonly=True) as store:
        assert store.list_runs()[0]["status"] == "partial"


def test_unwritable_json_is_a_user_error_and_the_store_is_still_closed(tmp_path, monkeypatch) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    closed: list[Store] = []
    real_close = Store.close

    def close(self) -> None:
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(Store, "close", close)
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "1") as url:
        cfg = SweepConfig(levels=[1], workload=Workload(name="w", isl=8, osl=4), url=url, num_prompts=2,
                          warmup=0, db=db, json_path=str(tmp_path))  # a folder: the JSON write fails
        with pytest.raises(UserError, match="cannot write"):
            run_sweep(cfg)
    assert len(closed) == 1
    with Store.open(db, readonly=True) as store:
        assert store.list_runs()[0]["status"] == "complete"


def test_server_returning_400s_fails_with_its_message(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--fail-status", "400") as url:
        code = main(["sweep", "--url", url, "--isl", "8", "--osl", "4", "--conc", "2", "--db", db])
    err = capsys.readouterr().err
    assert code == 3
    assert "HTTP 400" in err and "configured to fail" in err and "Traceback" not in err
    with Store.open(db, readonly=True) as store:
        assert store.list_runs() == []  # nothing was measured, so no run is left behind


def test_stream_ending_early_fails_the_level_with_a_clear_error(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", "1", "--end-early-after", "3") as url:
        code = main(["sweep", "--url", url, "--isl", "8", "--osl", "10", "--conc", "2", "--warmup", "0",
                     "--num-prompts", "2", "--db", db])
    err = capsys.readouterr().err
    assert code == 3 and "stream ended early" in err


def test_unreachable_url_is_one_clear_line(tmp_path, capsys) -> None:
    port = free_port()
    code = main(["sweep", "--url", f"http://127.0.0.1:{port}", "--conc", "4", "--db", f"sqlite:///{tmp_path}/k.db"])
    err = capsys.readouterr().err.strip()
    assert code == 3 and len(err.splitlines()) == 1
    assert f"cannot reach the server at http://127.0.0.1:{port}" in err


def test_url_and_engine_together_rejected(tmp_path, capsys) -> None:
    code = main(["sweep", "--url", "http://127.0.0.1:1", "--engine", "vllm", "--db", f"sqlite:///{tmp_path}/k.db"])
    assert code == 2 and "not both" in capsys.readouterr().err


@pytest.mark.engine
@pytest.mark.slow
def test_default_sweep_runs_the_bundled_tiny_engine(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path}/k.db"
    code = main(["sweep", "--isl", "32", "--osl", "8", "--conc", "2", "--num-prompts", "4", "--warmup", "1",
                 "--db", db, "--json", "run.json"])
    err = capsys.readouterr().err
    assert code == 0, err
    from k2bench.harness.servers.launch import models_dir

    assert (models_dir() / "tiny-arith" / "training.json").is_file()  # the trained model, from the shared cache
    doc = json.loads((tmp_path / "run.json").read_text())
    # the default sweep carries the trained model's accuracy on its task's held-out items
    (ev,) = doc["evals"]
    assert (ev["task"], ev["n"], ev["concurrency"]) == ("tiny-arith", 500, 2) and ev["value"] >= 0.95, ev
    assert doc["run"]["engine"] == "bundled" and doc["run"]["precision"] == "mxfp4"
    point = doc["points"][0]
    assert point["completed"] == 4 and point["failed"] == 0 and point["osl_mismatches"] == 0
    assert point["output_tokens"] == 4 * 8
    shutil.rmtree(tmp_path / "results", ignore_errors=True)


def test_launched_server_dying_mid_sweep_shows_its_log(tmp_path, capsys) -> None:
    """A launched server that exits after serving the first level: the error names the exit and its log."""
    db = f"sqlite:///{tmp_path}/k.db"

    def kill_server(point: dict) -> None:
        import os
        import signal

        from k2bench.harness.servers import launch as launch_mod

        if point["concurrency"] != 1:
            return
        for srv in list(launch_mod.Server.live):
            os.killpg(os.getpgid(srv.proc.pid), signal.SIGKILL)
            srv.proc.wait()

    cfg = SweepConfig(levels=[1, 2], workload=Workload(name="w", isl=8, osl=4), engine="testserver",
                      num_prompts=2, warmup=0, db=db, log_dir=str(tmp_path / "logs"))
    result = run_sweep(cfg, LevelEvents(level_done=kill_server))
    assert result.exit_code == 3
    assert re.search(r"(?s)^concurrency 2: the server was killed by signal 9 \(SIGKILL\).*k2bench launch",
                     result.problem)
    assert [(p["concurrency"], p["valid"]) for p in result.points] == [(1, True), (2, False)]
    assert "killed by signal 9" in result.points[1]["invalid_reason"]
    with Store.open(db, readonly=True) as store:
        assert store.list_runs()[0]["status"] == "partial"


def test_api_key_is_sent_and_a_missing_one_is_a_clear_error(tmp_path, capsys, monkeypatch) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    common = ["--isl", "8", "--osl", "4", "--conc", "1", "--num-prompts", "2", "--warmup", "0", "--db", db]
    with serving(tmp_path, "--api-key", "s3cret", "--ttft-ms", "1", "--itl-ms", "1", api_key="s3cret") as url:
        code = main(["sweep", "--url", url, *common])
        err = capsys.readouterr().err
        assert code == 3 and "HTTP 401" in err and "API key" in err
        monkeypatch.setenv("K2BENCH_API_KEY", "s3cret")
        assert main(["sweep", "--url", url, *common]) == 0


def test_launched_server_wanting_a_key_is_named_at_once(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["sweep", "--engine", "testserver", "--server-args=--api-key=k", "--conc", "1",
                 "--db", f"sqlite:///{tmp_path}/k.db"])
    err = capsys.readouterr().err
    assert code == 3 and "HTTP 401 on /v1/models" in err and "--api-key" in err


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("sigint_at_start", ["SIG_DFL", "SIG_IGN"])
def test_signal_mid_sweep_keeps_levels_and_stops_the_server(tmp_path, sig: str, sigint_at_start: str) -> None:
    """A real `k2bench sweep` process, signalled during its second level: it exits, the finished level
    is kept (run partial, JSON written), and the server it launched is gone. Also when it starts with
    SIGINT ignored, as a background job of a non-interactive shell does (`k2bench sweep ... &` in a CI
    script)."""
    import signal
    import socket
    import time

    db = f"sqlite:///{tmp_path}/k.db"
    argv = [sys.executable, "-m", "k2bench.harness.cli", "sweep", "--engine", "testserver",
            "--server-args=--ttft-ms 20 --itl-ms 20", "--isl", "8", "--osl", "40", "--conc", "1,2,4",
            "--num-prompts", "2", "--warmup", "0", "--db", db, "--json", str(tmp_path / "r.json")]
    disposition = getattr(signal, sigint_at_start)  # whatever the shell that runs pytest left
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, disposition))
    try:
        deadline = time.monotonic() + 60
        points = 0
        while time.monotonic() < deadline and points == 0:
            time.sleep(0.2)
            try:
                with Store.open(db, readonly=True) as store:
                    points = len(store.points_frame())
            except Exception:  # the database may not exist yet
                continue
        assert points >= 1, "the first level never finished"
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()[-2000:]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["run"]["status"] == "partial" and [p["concurrency"] for p in doc["points"]] == [1]
    port = int(doc["run"]["extra"]["base_url"].rsplit(":", 1)[1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nobody serves there any more


def test_every_request_of_a_level_gets_its_own_prompt(tmp_path, monkeypatch) -> None:
    """Warmup prompts are not reused by measured requests (prefix caches would make those cheap)."""
    db = f"sqlite:///{tmp_path}/k.db"
    seen: list[bytes] = []
    import k2bench.harness.load.loadgen as lg

    original = lg.request_body

    def spy(model, prompt, extra=None):
        body = original(model, prompt, extra)
        seen.append(bytes(prompt.token_ids.tobytes()))
        return body

    monkeypatch.setattr(lg, "request_body", spy)
    with serving(tmp_path, "--ttft-ms", "1", "--itl-ms", "1") as url:
        run_sweep(SweepConfig(levels=[2], workload=Workload(name="w", isl=16, osl=2), url=url, num_prompts=6,
                              warmup=4, db=db))
    assert len(seen) == 10 and len(set(seen)) == 10


def test_sigterm_inside_a_transport_callback_still_interrupts(tmp_path) -> None:
    """The SIGTERM of a cancelled CI job lands wherever the loop is; uvloop swallows a KeyboardInterrupt
    raised inside a protocol's data_received, so the sweep must not rely on raising it there."""
    import asyncio
    import os
    import signal
    import threading
    import time

    from k2bench.harness.load.loadgen import run as run_async
    from k2bench.harness.run.sweep import _sigterm_as_interrupt

    class Busy(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            end = time.monotonic() + 0.5
            while time.monotonic() < end:  # the signal arrives while this callback runs
                pass

    async def main_coro() -> str:
        async def send(reader, writer) -> None:
            writer.write(b"x")
            await writer.drain()

        server = await asyncio.start_server(send, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        await loop.create_connection(Busy, "127.0.0.1", port)
        await asyncio.sleep(1.5)
        server.close()
        return "finished"

    with pytest.raises(KeyboardInterrupt), _sigterm_as_interrupt():
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        run_async(main_coro())


def test_uncommitted_changes_are_flagged_on_the_run(tmp_path, monkeypatch) -> None:
    """A sweep of a checkout whose tracked files differ from HEAD says so (extra.git_dirty) and warns."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "engine.py").write_text("a = 1\n")
    subprocess.run([*git, "add", "engine.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    monkeypatch.chdir(repo)
    db = f"sqlite:///{tmp_path}/k.db"
    said: list[str] = []
    with serving(tmp_path, "--ttft-ms", "2", "--itl-ms", "1") as url:
        def sweep():
            cfg = SweepConfig(levels=[1], workload=Workload(name="w", isl=8, osl=2), url=url, num_prompts=1,
                              warmup=0, db=db)
            return run_sweep(cfg, LevelEvents(message=said.append))

        clean = sweep()
        (repo / "engine.py").write_text("a = 2\n")
        dirty = sweep()
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert clean.meta["commit"] == dirty.meta["commit"] == head
    assert "git_dirty" not in clean.meta["extra"] and dirty.meta["extra"]["git_dirty"] is True
    assert sum("differ from commit" in line for line in said) == 1
    with Store.open(db, readonly=True) as store:
        assert store.get_run(dirty.run_id)["extra"]["git_dirty"] is True
