"""No secret a sweep is handed ends up anywhere k2bench writes or prints.

Real sweeps against the test server, one launched through --server-cmd (so the server's log, which
k2bench keeps, is exercised: the server prints secrets into it) and one attached through a URL with a
password. Each secret shape carries its own value; afterwards none of the values may appear in the
database, the JSON export, `show` and `show --repro`, the kept server logs, or the console.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2bench.harness.cli import main
from k2bench.harness.servers import launch

# shape -> a value that appears nowhere else
SHAPES = {
    "url password (--url)": "UrlPa55-q8",
    "query token in a URL (--notes)": "QrySig-77a",
    "query token in a server argument": "QryAccess-31",
    "--api-key K": "ApiKeyVal-19",
    "--api-key=K inside --server-cmd": "ApiKeyEq-20",
    "NAME=value inside --server-cmd (MY_DB_PASS)": "NamePass-41",
    "NAME=value inside --server-cmd (ORACLE_PWD)": "NamePwd-42",
    "NAME=value inside --server-cmd (GITHUB_PAT)": "NamePat-43",
    "env HF_TOKEN": "EnvHfTok-51",
    "env VLLM_API_KEY": "EnvVllmKey-52",
    "env ATOM_DB_PASS": "EnvAtomPass-53",
    "env AITER_ADMIN_PWD": "EnvAiterPwd-54",
    "env K2BENCH_GITHUB_PAT": "EnvK2Pat-55",
    "env TRITON_CLIENT_SECRET": "EnvTriSecret-56",
    "env K2BENCH_DB url password": "EnvDbUrlPw-57",
    "--db url password": "DbUrlPw-61",
}
S = SHAPES


def _db_url(backend: str, tmp_path: Path, request) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/k.db"
    scheme, rest = request.getfixturevalue("pg_url").split("://", 1)
    user, at, host = rest.rpartition("@")
    assert at, "the test PostgreSQL URL names its user"
    return f"{scheme}://{user.split(':')[0]}:{S['--db url password']}@{host}"  # the test server trusts any password


def _stored_text(backend: str, db: str, tmp_path: Path) -> str:
    """Everything the database holds, as text: the file's bytes for SQLite, every row for PostgreSQL."""
    if backend == "sqlite":
        return b"".join(p.read_bytes() for p in tmp_path.glob("k.db*")).decode("latin-1")
    import sqlalchemy as sa

    engine = sa.create_engine(db)
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        with engine.connect() as conn:
            return "\n".join(repr(row) for table in meta.sorted_tables for row in conn.execute(table.select()))
    finally:
        engine.dispose()


def _leaks(where: dict[str, str]) -> list[str]:
    return [f"{shape} in {name}" for shape, value in SHAPES.items() for name, text in where.items() if value in text]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_no_secret_reaches_the_record_the_logs_or_the_console(backend, tmp_path, capsys, monkeypatch,
                                                              request) -> None:
    monkeypatch.chdir(tmp_path)  # server logs go to ./results/logs
    for name in ("HF_TOKEN", "VLLM_API_KEY", "ATOM_DB_PASS", "AITER_ADMIN_PWD", "K2BENCH_GITHUB_PAT",
                 "TRITON_CLIENT_SECRET"):
        monkeypatch.setenv(name, S[f"env {name}"])
    monkeypatch.setenv("K2BENCH_DB", f"postgresql://bench:{S['env K2BENCH_DB url password']}@nowhere.invalid/k2")
    monkeypatch.setenv("K2BENCH_KEYBOARD_LAYOUT", "us-intl")  # recorded, and not a secret
    db = _db_url(backend, tmp_path, request)
    server = (f"env MY_DB_PASS={S['NAME=value inside --server-cmd (MY_DB_PASS)']} "
              f"ORACLE_PWD={S['NAME=value inside --server-cmd (ORACLE_PWD)']} "
              f"GITHUB_PAT={S['NAME=value inside --server-cmd (GITHUB_PAT)']} "
              # the server prints secrets into its own log, which k2bench keeps
              "sh -c 'echo server sees $MY_DB_PASS $ORACLE_PWD $GITHUB_PAT $HF_TOKEN $VLLM_API_KEY; "
              "exec {python} -m k2bench.harness.load.testserver --host {host} --port {port} --model {model} "
              f"--api-key={S['--api-key=K inside --server-cmd']} "
              f"--root https://hub.example/m?access_token={S['query token in a server argument']}'")
    common = ["--isl", "8", "--osl", "4", "--conc", "1", "--num-prompts", "2", "--warmup", "0", "--db", db,
              "--no-telemetry"]
    # the server wants the key given inside --server-cmd; k2bench's --api-key must be the same key
    S_key = S["--api-key=K inside --server-cmd"]
    code = main(["sweep", "--server-cmd", server, "--api-key", S_key, *common, "--json", "launched.json",
                 "--notes", f"see https://files.example/r?sig={S['query token in a URL (--notes)']}"])
    assert code == 0, capsys.readouterr().err
    # --api-key K (the flag's other form) reaches a launched testserver through the recipe's own argument
    code2 = main(["sweep", "--engine", "testserver", "--server-args", f"--api-key {S['--api-key K']}",
                  "--api-key", S["--api-key K"], *common, "--json", "keyed.json"])
    assert code2 == 0, capsys.readouterr().err
    with launch.from_recipe("testserver", model="m", extra_args=["--ttft-ms", "1"], log_dir=tmp_path / "own") as srv:
        attached = srv.base_url.replace("http://", f"http://bench:{S['url password (--url)']}@")
        code3 = main(["sweep", "--url", attached, *common, "--json", "attached.json"])
    assert code3 == 0, capsys.readouterr().err
    docs = {name: json.loads((tmp_path / name).read_text()) for name in ("launched.json", "keyed.json",
                                                                          "attached.json")}
    for doc in docs.values():
        rid = str(doc["run"]["id"])
        assert main(["show", rid, "--db", db]) == 0
        assert main(["show", rid, "--repro", "--db", db]) == 0
    console = capsys.readouterr()
    logs = {str(p): p.read_text(errors="replace") for p in (tmp_path / "results" / "logs").glob("*")}
    assert len(logs) == 2 and all("server sees" in t for t in logs.values() if "custom" in t)
    where = {"the database": _stored_text(backend, db, tmp_path), "the console": console.out + console.err,
             **{name: json.dumps(doc) for name, doc in docs.items()}, **logs}
    assert _leaks(where) == []
    # masked, not dropped: what is not secret is still there to reproduce the run
    launched, attached_run = docs["launched.json"]["run"], docs["attached.json"]["run"]
    env = launched["extra"]["repro"]["server_env"]
    assert env["K2BENCH_KEYBOARD_LAYOUT"] == "us-intl" and env["HF_TOKEN"] == "***"
    assert env["K2BENCH_DB"] == "postgresql://bench:***@nowhere.invalid/k2"
    assert "MY_DB_PASS=***" in launched["server_command"] and "--api-key=***" in launched["server_command"]
    assert attached_run["extra"]["base_url"].startswith("http://bench:***@127.0.0.1:")
    assert "server sees *** *** *** *** ***" in "".join(logs.values())
    assert "export K2BENCH_KEYBOARD_LAYOUT=us-intl" in console.out
