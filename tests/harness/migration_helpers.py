"""Databases at old schema revisions, for the upgrade tests (test_store_migrations, test_db_cli): built by
that revision's own migrations and filled with rows made from its reflected columns."""

from __future__ import annotations

from datetime import datetime, timedelta

from alembic import command
from sqlalchemy import JSON, MetaData, Table, create_engine, insert, select

from k2bench.harness.store import db

ROWS = {"runs": 2, "points": 6, "requests": 42}  # 2 runs x 3 levels x 7 requests; other tables: 3 rows
OTHER_ROWS = 3


def revisions() -> list[str]:
    """Every revision, oldest first."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(db.alembic_config())
    return [s.revision for s in reversed(list(scripts.walk_revisions()))]


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


