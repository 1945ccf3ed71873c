"""Upgrading a database written at any earlier schema revision loses nothing.

For every revision the migrations folder holds (read from Alembic, so a new migration is picked up
without editing this file), the test builds a database at that revision with Alembic's own
`upgrade <rev>`, fills every table it has with rows made from the reflected columns of that
revision, upgrades it the way k2bench does, and compares every stored value. SQLite, and PostgreSQL
when K2BENCH_TEST_PG_URL is set."""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import JSON, MetaData, Table, create_engine, insert, select, text

from k2bench.harness.store import Store, db
from k2bench.harness.store.upgrade import upgrade_database

PG_URL = os.environ.get("K2BENCH_TEST_PG_URL")
ROWS = {"runs": 2, "points": 6, "requests": 42}  # 2 runs x 3 levels x 7 requests; other tables: 3 rows
OTHER_ROWS = 3


def revisions() -> list[str]:
    """Every revision, oldest first."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(db.alembic_config())
    return [s.revision for s in reversed(list(scripts.walk_revisions()))]


OLD = revisions()[:-1]


def _reset_postgres(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'k2bench.db'}"
    if not PG_URL:
        pytest.skip("K2BENCH_TEST_PG_URL is not set (bash .ci/run starts a PostgreSQL)")
    _reset_postgres(PG_URL)
    return PG_URL


def build_at(url: str, rev: str) -> None:
    """A database at schema revision ``rev``, made by that revision's own migrations, through the
    same engine settings k2bench uses (foreign keys on, WAL)."""
    _, engine = db.make_engines(db.parse_url(url), readonly=False)
    with engine.begin() as conn:
        command.upgrade(db.alembic_config(conn), rev)
    engine.dispose()


def _value(column, i: int, parents: dict[str, list[int]]):
    """A value for row i fitting the column's reflected type (foreign keys point at stored parents)."""
    for fk in column.foreign_keys:
        ids = parents[fk.column.table.name]
        return ids[i * len(ids) // ROWS.get(column.table.name, OTHER_ROWS)]
    if isinstance(column.type, JSON):
        return {"col": column.name, "row": i}
    kind = column.type.python_type
    if kind is bool:
        return i % 2 == 0
    if kind is int:
        return 10 * i + len(column.name)  # distinct per row, so unique levels stay unique
    if kind is float:
        return i + 0.25 * len(column.name)
    if kind is str:
        length = getattr(column.type, "length", None) or 64
        return f"{column.name[:4]}{i}"[:length]
    if kind is datetime:
        return datetime(2026, 11, 29, 12, 0, 0) + timedelta(minutes=i, seconds=len(column.name))
    if kind is bytes:
        return bytes([i % 256, len(column.name) % 256]) * 5
    raise AssertionError(f"no test value for {column.table.name}.{column.name} ({column.type!r})")


def fill(url: str) -> dict[str, list[dict]]:
    """Rows in every table of the database as it stands (parents before children), written with
    plain INSERTs built from the reflected schema; returns them by table."""
    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    written: dict[str, list[dict]] = {}
    parents: dict[str, list[int]] = {}
    with engine.begin() as conn:
        for table in meta.sorted_tables:
            if table.name == "alembic_version":
                continue
            rows = []
            for i in range(ROWS.get(table.name, OTHER_ROWS)):
                row = {c.name: _value(c, i, parents) for c in table.columns}
                row["id"] = i + 1
                rows.append(row)
            conn.execute(insert(table), rows)
            written[table.name] = rows
            parents[table.name] = [r["id"] for r in rows]
    engine.dispose()
    return written


def stored(url: str, tables: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """What the database holds now of the given tables' rows and columns, ordered by id."""
    engine = create_engine(url)
    out = {}
    with engine.connect() as conn:
        meta = MetaData()
        for name, rows in tables.items():
            table = Table(name, meta, autoload_with=conn)
            cols = [table.c[c] for c in rows[0] if c in table.c]
            out[name] = [dict(r._mapping) for r in conn.execute(select(*cols).order_by(table.c.id))]
    engine.dispose()
    return out


def revision_of(url: str) -> str:
    engine = create_engine(url)
    with engine.connect() as conn:
        rev = db.current_revision(conn)
    engine.dispose()
    return rev


def test_every_revision_is_in_the_list():
    assert OLD and OLD[0] == "0001" and revisions()[-1] == db.head_revision()


@pytest.mark.parametrize("rev", OLD)
def test_upgrade_keeps_every_row(url, rev, capsys):
    """A database at each earlier revision upgraded by k2bench keeps every row and value."""
    build_at(url, rev)
    before = fill(url)
    assert len(before["requests"]) == ROWS["requests"]
    if url.startswith("sqlite"):
        Store.open(url).close()  # what a writing command does (sweep, import)
    else:
        upgrade_database(url)  # PostgreSQL upgrades only when asked: `k2bench db upgrade`
    assert revision_of(url) == db.head_revision()
    after = stored(url, before)
    for name, rows in before.items():
        assert len(after[name]) == len(rows), f"{name}: {len(rows)} rows before the upgrade, {len(after[name])} after"
        assert after[name] == rows, f"{name}: values changed by the upgrade"
    with Store.open(url, readonly=True) as store:  # and the store reads them back
        runs = store.list_runs()
    assert {r["id"] for r in runs} == {1, 2} and sum(r["levels"] for r in runs) == ROWS["points"]
    if url.startswith("sqlite"):
        assert "copy from before the upgrade" in capsys.readouterr().err


@pytest.mark.parametrize("rev", OLD)
def test_sqlite_backup_is_the_old_database(tmp_path, rev, capsys):
    """Before migrating a SQLite file, k2bench keeps a copy named after the old revision and says where."""
    url = f"sqlite:///{tmp_path / 'k2bench.db'}"
    build_at(url, rev)
    before = fill(url)
    Store.open(url).close()
    copies = list(tmp_path.glob(f"k2bench.db.rev{rev}-*.bak"))
    assert len(copies) == 1, sorted(p.name for p in tmp_path.iterdir())
    assert re.fullmatch(rf"k2bench\.db\.rev{rev}-\d{{8}}T\d{{6}}Z\.bak", copies[0].name)
    assert str(copies[0]) in capsys.readouterr().err
    copy_url = f"sqlite:///{copies[0]}"
    assert revision_of(copy_url) == rev
    assert stored(copy_url, before) == before
    Store.open(url).close()  # at head now: no second copy
    assert len(list(tmp_path.glob("k2bench.db.rev*.bak"))) == 1
