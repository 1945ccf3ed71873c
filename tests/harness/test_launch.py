"""Launcher: readiness, logs, clear errors, and the whole process group always stopped."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from k2bench.errors import ServerError, UserError
from k2bench.harness.servers import launch, recipes
from k2bench.net import free_port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours still answers kill(0); read its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_testserver_recipe_starts_records_and_stops(tmp_path) -> None:
    server = launch.from_recipe("testserver", model="m", log_dir=tmp_path, extra_args="--ttft-ms 5")
    with server:
        pid = server.proc.pid
        assert _alive(pid)
        assert server.version and "k2bench" in server.version
        assert server.flags == ["--ttft-ms", "5"]
        assert "k2bench.harness.load.testserver" in server.command and "--ttft-ms 5" in server.command
    assert _wait_gone(pid)
    assert server.log_path.parent == tmp_path and server.log_path.read_text().startswith("# k2bench launch")


def test_whole_process_group_is_stopped_even_on_ctrl_c(tmp_path) -> None:
    """The server forks a worker (like TP ranks do); Ctrl-C inside the block must stop both."""
    port = free_port()
    child_pid_file = tmp_path / "child.pid"
    script = (f"sleep 600 & echo $! > {child_pid_file}; "
              f"exec {sys.executable} -m k2bench.harness.load.testserver --port {port}")
    server = launch.Server(["bash", "-c", script], host="127.0.0.1", port=port, log_path=tmp_path / "s.log",
                           ready_timeout_s=30)
    with pytest.raises(KeyboardInterrupt):
        with server:
            leader = server.proc.pid
            child = int(child_pid_file.read_text())
            assert _alive(child)
            raise KeyboardInterrupt
    assert _wait_gone(leader) and _wait_gone(child)


def test_process_that_dies_reports_log_tail(tmp_path) -> None:
    argv = [sys.executable, "-c", "import sys; print('loading weights'); print('CUDA out of memory'); sys.exit(7)"]
    server = launch.Server(argv, host="127.0.0.1", port=free_port(), log_path=tmp_path / "d.log", ready_timeout_s=30)
    with pytest.raises(ServerError, match=r"exited with code 7(.|\n)*CUDA out of memory"):
        with server:
            pass


def test_not_ready_in_time_is_an_error_and_the_server_is_stopped(tmp_path) -> None:
    server = launch.from_recipe("testserver", model="m", log_dir=tmp_path, extra_args="--start-delay-s 60",
                                ready_timeout_s=1.5)
    server.start()
    pid = server.proc.pid
    with pytest.raises(ServerError, match=r"not ready \(/health did not answer 200\) within 1.5 s"):
        with server:
            pass
    assert _wait_gone(pid)


def test_readiness_waits_for_health_then_models(tmp_path) -> None:
    server = launch.from_recipe("testserver", model="m", log_dir=tmp_path, extra_args="--start-delay-s 1")
    t0 = time.monotonic()
    with server:
        assert time.monotonic() - t0 >= 1.0


def test_unknown_recipe_lists_valid_ones() -> None:
    with pytest.raises(UserError, match="unknown engine recipe 'trt'; known: atom, bundled, sglang, testserver, vllm"):
        recipes.get("trt")


def test_recipes_render_as_data() -> None:
    argv, flags = recipes.render(recipes.get("atom"), model="amd/Kimi-K2.5-MXFP4", tp=4, port=8123)
    assert argv[:3] == ["python3", "-m", "atom.entrypoints.openai_server"]
    assert ["--server-port", "8123"] == argv[argv.index("--server-port"):argv.index("--server-port") + 2]
    assert "-tp" in argv and argv[argv.index("-tp") + 1] == "4"
    assert flags[:2] == ["--scheduler-delay-factor", "1"] and "--trust-remote-code" in flags
    assert recipes.get("atom").env["AITER_QUICK_REDUCE_QUANTIZATION"] == "INT4"
    bundled, _ = recipes.render(recipes.get("bundled"), model="/m", tp=2, port=9, extra_args="--max-num-seqs 8")
    assert bundled[1:4] == ["-m", "k2bench.harness.cli", "serve"] and bundled[-2:] == ["--max-num-seqs", "8"]
    assert bundled[bundled.index("--tp") + 1] == "2"


def test_missing_executable_is_a_server_error(tmp_path) -> None:
    server = launch.Server(["/nonexistent/k2-server"], host="127.0.0.1", port=free_port(),
                           log_path=tmp_path / "x.log", ready_timeout_s=5)
    with pytest.raises(ServerError, match="cannot start"):
        with server:
            pass


def test_server_handle_reports_a_launched_servers_death(tmp_path) -> None:
    """The sweep's handle: a launched server's exit is seen with its signal and log; an attached one has
    no process to watch and never reads as dead."""
    import signal

    with launch.open_server(engine="testserver", model="m", log_dir=tmp_path) as handle:
        assert handle.engine == "testserver" and handle.served_models == ["m"]
        assert handle.url.startswith("http://127.0.0.1:") and handle.log_path.parent == tmp_path
        assert "k2bench.harness.load.testserver" in handle.command
        assert not handle.died() and handle.exit_status() is None and handle.death_note() is None
        with launch.open_server(url=handle.url + "/v1/") as attached:
            assert attached.url == handle.url and attached.engine == "external"
            assert attached.served_models == ["m"]
            assert attached.process is None and attached.log_path is None and attached.command is None
            assert not attached.died() and attached.exit_status() is None
        pid = handle.process.pid
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        handle.process.wait()
        assert handle.died() and handle.exit_status() == -9
        note = handle.death_note()
        assert "was killed by signal 9 (SIGKILL)" in note and str(handle.log_path) in note
        assert "# k2bench launch" in note  # the log's tail
    assert handle.process is None and handle.exit_status() == -9  # stopped; the exit is remembered


def test_exit_descriptions_name_codes_and_signals() -> None:
    assert launch.describe_exit(0) == "exited with code 0"
    assert launch.describe_exit(7) == "exited with code 7"
    assert launch.describe_exit(-15) == "was killed by signal 15 (SIGTERM)"
    assert launch.describe_exit(-200) == "was killed by signal 200"


def test_open_server_needs_a_model_for_a_recipe_without_one(tmp_path) -> None:
    with pytest.raises(UserError, match="--engine vllm needs --model"), launch.open_server(engine="vllm"):
        pass


class _FakeTrainer:
    """Stands in for the `k2bench engine tiny --task tiny-arith --reuse` child: prints its lines and, when it
    succeeds, leaves a model folder behind, as the real one does."""

    def __init__(self, lines: list[str], code: int, out: Path | None) -> None:
        self.lines, self.code, self.out = lines, code, out
        self.argv: list[str] = []

    def __call__(self, argv, **kwargs):
        self.argv = argv
        if self.out is not None and self.code == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text("{}")
        self.stdout = iter(line + "\n" for line in self.lines)
        return self

    def wait(self) -> int:
        return self.code


def test_the_default_model_is_trained_with_progress_then_reused(tmp_path, monkeypatch) -> None:
    """ensure_tiny_model asks the engine's CLI for the cached trained model under $K2BENCH_MODELS; a training
    run is announced and its progress passed on, a cache hit says nothing."""
    monkeypatch.setenv(launch.MODELS_ENV, str(tmp_path / "models"))
    out = tmp_path / "models" / "tiny-arith"
    said: list[str] = []
    child = _FakeTrainer(["step    0  loss 6.2  qat off  0 s", "step 1499  loss 0.001  qat on  107 s",
                          "Writing model shards: 100%", "trained on tiny-arith in 107.4 s: ..."], 0, out)
    monkeypatch.setattr(launch.subprocess, "Popen", child)
    assert launch.ensure_tiny_model(say=said.append) == out
    assert child.argv[-6:] == ["tiny", "--task", "tiny-arith", "--out", str(out), "--reuse"]
    assert said[0].startswith(f"training the bundled tiny model on tiny-arith into {out} (once")
    assert said[1:] == ["  step    0  loss 6.2  qat off  0 s", "  step 1499  loss 0.001  qat on  107 s",
                        "  trained on tiny-arith in 107.4 s: ..."]
    said.clear()
    monkeypatch.setattr(launch.subprocess, "Popen", _FakeTrainer(["reusing the trained tiny-arith model"], 0, out))
    assert launch.ensure_tiny_model(say=said.append) == out and said == []


def test_a_failed_training_is_one_user_error_with_its_last_lines(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(launch.MODELS_ENV, str(tmp_path / "models"))
    lines = ["step    0  loss 6.2  qat off  0 s", "k2bench: error: training needs the engine extra (torch and "
             "transformers): pip install 'k2bench[engine]'"]
    monkeypatch.setattr(launch.subprocess, "Popen", _FakeTrainer(lines, 2, None))
    with pytest.raises(UserError, match=r"could not train the tiny model .*pip install 'k2bench\[engine\]'"):
        launch.ensure_tiny_model()
