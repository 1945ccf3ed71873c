"""The bundled engine's profiler end to end on CPU: `sweep --profile-level 4:8` against the tiny checkpoint
writes a Chrome trace and a kernel-time summary, the run keeps them, the level's figures leave the
profiled requests out; a run with one engine function slowed (K2BENCH_TEST_SLOW) shows that function at
the top of `k2bench profile-diff`. Also /start_profile and /stop_profile called out of order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from k2bench.harness.cli import main
from k2bench.harness.store import Store
from k2bench.net import free_port

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SERVER_ARGS = "--num-kv-blocks 256 --block-size 16 --max-model-len 1024"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from k2bench.engine.model.tiny import TinySpec, write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny", quant="mxfp4", seed=3,
                                 spec=TinySpec(layers=2))


def _sweep(tiny: Path, db: str) -> list[str]:
    return ["sweep", "--engine", "bundled", "--model", str(tiny), "--server-args", SERVER_ARGS, "--isl", "32",
            "--osl", "8", "--conc", "4", "--num-prompts", "8", "--warmup", "2", "--profile-level", "4:8",
            "--db", db, "--eval", "none"]


def test_profiled_level_is_kept_and_a_slowed_function_tops_the_diff(tiny, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path}/k.db"
    assert main(_sweep(tiny, db)) == 0, capsys.readouterr().err
    with Store.open(db, readonly=True) as store:
        (run,) = store.list_runs()
        prof = store.get_run(run["id"])["profile"]
        (point,) = store.points_frame(run_ids=[run["id"]]).to_dict("records")
        stored_requests = store.load_records(run["id"], include_warmup=True)
    # the profiled pass is apart: the level has its 8 measured requests and 2 warmups, nothing more
    assert point["num_prompts"] == 8 and point["completed"] == 8
    assert len(stored_requests) == 10
    assert (prof["concurrency"], prof["requests"], prof["completed"]) == (4, 8, 8)
    trace, summary = Path(prof["trace"]), prof["summary"]
    assert trace.is_file() and trace.is_relative_to(tmp_path / "results" / "logs" / "profiles")
    events = json.loads(trace.read_text())["traceEvents"]
    forward = [e for e in events if e.get("name") == "engine.forward" and e.get("ph") == "X"]
    # a summary of that trace: one forward pass per engine step of the window, as the trace shows them
    assert summary["format"] == "k2bench.profile/1" and summary["device"] == "cpu"
    ops = {op["name"]: op for op in summary["ops"]}
    assert summary["steps"] >= 8 // 4 * 8  # at least the decode steps of two batches of 4 x 8 tokens
    assert ops["engine.forward"]["calls"] == summary["steps"] == len(forward)
    assert ops["aten::mm"]["calls"] > 0 and ops["aten::mm"]["self_us"] > 0
    assert json.loads(Path(prof["summary_path"]).read_text()) == summary

    monkeypatch.setenv("K2BENCH_TEST_SLOW", "engine.sample:40")
    assert main(_sweep(tiny, db)) == 0, capsys.readouterr().err
    capsys.readouterr()
    with Store.open(db, readonly=True) as store:
        slow_run = store.list_runs()[0]["id"]
    assert main(["profile-diff", str(run["id"]), str(slow_run), "--db", db, "--format", "md"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert rows[0].startswith("| `engine.sample` | cpu |"), rows[:4]
    cells = [c.strip() for c in rows[0].split("|")]
    assert float(cells[5].replace(",", "")) > 30_000  # about 40 ms more per step, each step samples once


def _post(url: str, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_profile_endpoints_refuse_calls_out_of_order(tiny, tmp_path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "k2bench.harness.cli", "serve", "--model", str(tiny), "--port",
                             str(port), *SERVER_ARGS.split()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "K2BENCH_PROFILE_DIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                urllib.request.urlopen(url + "/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.3)
        status, body = _post(url + "/stop_profile")
        assert status == 400 and "not running" in body["error"]["message"]
        assert _post(url + "/start_profile", {"output_dir": 5})[0] == 400
        status, body = _post(url + "/start_profile")  # no output_dir: K2BENCH_PROFILE_DIR
        assert status == 200 and body["output_dir"] == str(tmp_path.resolve())
        status, body = _post(url + "/start_profile")
        assert status == 400 and "already running" in body["error"]["message"]
        status, body = _post(url + "/stop_profile")
        # an idle window: a trace and a summary all the same, of no engine step
        assert status == 200 and Path(body["trace"]).parent == tmp_path.resolve() and body["summary"]["steps"] == 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stdout.close()


def test_slow_switch_is_checked(monkeypatch) -> None:
    from k2bench.engine.runtime.profiler import slow_switch

    monkeypatch.setenv("K2BENCH_TEST_SLOW", "engine.sample:12.5")
    assert slow_switch() == ("engine.sample", 0.0125)
    for bad, why in (("engine.nothing:5", "must be one of"), ("engine.sample:x", "SECTION:MILLISECONDS"),
                     ("engine.sample:0", "positive")):
        monkeypatch.setenv("K2BENCH_TEST_SLOW", bad)
        with pytest.raises(ValueError, match=why):
            slow_switch()
