"""Shared fixtures. Tests mirror the code folders: tests/harness, tests/workloads, tests/engine, tests/analysis,
tests/dashboard; tests/test_import_boundaries.py guards the folders' import rules.

`free_port` is k2bench.net's (imported here for the fixture; tests import it from k2bench.net)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from k2bench.net import free_port

# One cache of generated and trained models for every test and the processes they start (the default
# sweep, the README's quick start, the accuracy tests): the trained tiny model is keyed by its trainer's
# version and settings, so the suite trains it at most once, and not at all when this checkout has it.
os.environ.setdefault("K2BENCH_MODELS", str(Path(__file__).resolve().parents[1] / "results" / "models"))


@contextlib.contextmanager
def private_pg_database(prefix: str = "k2bench_t") -> Iterator[str]:
    """A private database of the test PostgreSQL (K2BENCH_TEST_PG_URL), dropped on the way out. Test files
    run side by side (pytest-xdist), so no test may reset a database another one uses."""
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = os.environ.get("K2BENCH_TEST_PG_URL")
    if not base:
        pytest.skip("K2BENCH_TEST_PG_URL is not set (bash .ci/run starts a PostgreSQL)")
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def pg_url() -> Iterator[str]:
    with private_pg_database() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    """A store URL on each backend: SQLite in a folder the store must create, and a private PostgreSQL
    database (skipped where none runs)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sub' / 'k2bench.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def port() -> int:
    """A free loopback port (no hard-coded ports in tests)."""
    return free_port()
