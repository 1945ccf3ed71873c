"""`k2bench dashboard`: the streamlit command it execs, and its user errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from k2bench.errors import UserError
from k2bench.harness import cli
from k2bench.harness.commands import dashboard as cmd


def parse(*argv: str):
    return cli.build_parser().parse_args(["dashboard", *argv])


def test_command_runs_streamlit_on_the_app_with_the_db_in_the_environment():
    argv, env = cmd.streamlit_command(parse("--db", "sqlite:///x.db", "--port", "9123", "--host", "0.0.0.0"))
    assert argv[:4] == [sys.executable, "-m", "streamlit", "run"]
    assert Path(argv[4]) == Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    assert Path(argv[4]).is_file()
    assert argv[argv.index("--server.port") + 1] == "9123"
    assert argv[argv.index("--server.address") + 1] == "0.0.0.0"
    assert argv[argv.index("--server.headless") + 1] == "true"
    assert env["K2BENCH_DB"] == "sqlite:///x.db"


def test_defaults_bind_loopback_and_keep_the_callers_db(monkeypatch):
    monkeypatch.setenv("K2BENCH_DB", "sqlite:///from-env.db")
    argv, env = cmd.streamlit_command(parse())
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.port") + 1] == str(cmd.DEFAULT_PORT)
    assert env["K2BENCH_DB"] == "sqlite:///from-env.db"


def test_handler_execs_the_command(monkeypatch):
    seen = {}
    monkeypatch.setattr(cmd.os, "execvpe", lambda file, argv, env: seen.update(file=file, argv=argv, env=env))
    assert cli.main(["dashboard", "--db", "sqlite:///y.db", "--port", "9124"]) == 0
    assert seen["file"] == sys.executable and "9124" in seen["argv"] and seen["env"]["K2BENCH_DB"] == "sqlite:///y.db"


def test_missing_streamlit_is_a_user_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "streamlit", None)  # import machinery now reports it absent
    monkeypatch.setattr(cmd.os, "execvpe", lambda *a: pytest.fail("must not exec without streamlit"))
    assert cli.main(["dashboard"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("k2bench: error:") and "k2bench[dashboard]" in err and "Traceback" not in err


@pytest.mark.parametrize("port", ["0", "70000"])
def test_bad_port_is_rejected(port):
    with pytest.raises(UserError, match="--port"):
        cmd.streamlit_command(parse("--port", port))
