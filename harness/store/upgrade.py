"""Schema upgrades that cannot lose data, and the refusal to read a database at another revision.

Why this is careful: SQLite cannot alter most columns in place, so Alembic rebuilds a table (copy,
drop, rename). With foreign keys on, that drop cascades to every child row: rebuilding `points`
once emptied `requests`. So an upgrade on SQLite runs with foreign keys off on its connection (the
pragma is a no-op inside a transaction, hence set before BEGIN), checks them with
`PRAGMA foreign_key_check` before committing, and refuses to commit if any table lost rows. A
SQLite file is copied first (kept beside it); a PostgreSQL database is upgraded only when asked
(`k2bench db upgrade`), after the user has taken a pg_dump.
"""

from __future__ import annotations

import shlex
import sqlite3
import sys
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from k2bench.errors import UserError
from k2bench.harness.store import db

UPGRADE_COMMAND = "k2bench db upgrade"
_PG_LOCK = 7231001  # advisory lock: two processes opening one fresh PostgreSQL database at once


def newer_error(url: str, rev: str) -> UserError:
    return UserError(
        f"database {url} has schema revision {rev}, which this k2bench does not know (its newest is "
        f"{db.head_revision()}): the database was written by a newer k2bench; upgrade k2bench"
    )


def _upgrade_hint(url: str) -> str:
    return f"`{UPGRADE_COMMAND} --db {shlex.quote(url)}`"


def _pg_dump(engine: Engine, rev: str) -> str:
    """A backup command for the PostgreSQL database behind engine (connection options left to the user)."""
    return f"pg_dump --format=custom --file=k2bench-rev{rev}.dump {shlex.quote(engine.url.database or 'DBNAME')}"


def check_schema(read_engine: Engine) -> None:
    """For commands that only read: the schema must already be at head; never migrates."""
    head = db.head_revision()
    url = db.safe_url(read_engine.url)
    with read_engine.connect() as conn:
        rev = db.current_revision(conn)
    if rev == head:
        return
    if rev is None:
        raise UserError(f"database {url} has no k2bench tables (run a sweep or `k2bench import` first)")
    if rev not in db.known_revisions():
        raise newer_error(url, rev)
    if read_engine.dialect.name == "sqlite":
        how = f"upgrade it with {_upgrade_hint(url)} (it copies the file first) or a writing command (sweep, import)"
    else:
        how = f"back it up (e.g. `{_pg_dump(read_engine, rev)}`), then upgrade it with {_upgrade_hint(url)}"
    raise UserError(
        f"database {url} has schema revision {rev} and this k2bench needs {head}; commands that only read "
        f"never upgrade a database: {how}"
    )


def migrate(write_engine: Engine, explicit: bool = False) -> str | None:
    """Bring the schema to head; returns the revision it started from (None: created or at head).

    Implicit upgrades (a writing command opening the store) happen on SQLite, after a copy of the file;
    a PostgreSQL database at an older revision is upgraded only when ``explicit`` (`k2bench db upgrade`)."""
    head = db.head_revision()
    url = db.safe_url(write_engine.url)
    with write_engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            _foreign_keys(conn, on=False)
        try:
            with conn.begin():
                if not sqlite:
                    conn.execute(text(f"SELECT pg_advisory_xact_lock({_PG_LOCK})"))
                rev = db.current_revision(conn)
                if rev == head:
                    return None
                if rev is not None and rev not in db.known_revisions():
                    raise newer_error(url, rev)
                if rev is None:
                    db.upgrade_to(conn, "head")
                    return None
                _before_upgrade(conn, url, rev, head, explicit)
                counts = _row_counts(conn)
                db.upgrade_to(conn, "head")
                if sqlite:
                    _check_foreign_keys(conn, url, rev)
                _check_nothing_lost(counts, _row_counts(conn), url, rev)
        finally:
            if sqlite:
                _foreign_keys(conn, on=True)
    return rev


def database_revision(url: str) -> str | None:
    """The schema revision of the database at url (None: no k2bench tables), read without changing it."""
    parsed = db.parse_url(url)
    db.require_existing(parsed)
    engine, _ = db.make_engines(parsed, readonly=True)
    try:
        with engine.connect() as conn:
            return db.current_revision(conn)
    except SQLAlchemyError as exc:
        raise UserError(f"cannot open database {db.safe_url(parsed)}: {db.first_line(exc)}") from None
    finally:
        engine.dispose()


def upgrade_database(url: str) -> str | None:
    """`k2bench db upgrade`: create or upgrade the database at url (PostgreSQL too); returns the old revision."""
    parsed = db.parse_url(url)
    db.require_existing(parsed)
    _, engine = db.make_engines(parsed, readonly=False)
    try:
        return migrate(engine, explicit=True)
    except SQLAlchemyError as exc:
        raise UserError(f"cannot upgrade database {db.safe_url(parsed)}: {db.first_line(exc)}") from None
    finally:
        engine.dispose()


def _before_upgrade(conn: Connection, url: str, rev: str, head: str, explicit: bool) -> None:
    """Keep a copy of a SQLite file; refuse an implicit PostgreSQL upgrade, saying how to back it up."""
    path = db.sqlite_path(conn.engine.url)
    if conn.dialect.name == "sqlite":
        if path is None:  # in-memory: nothing to copy, nothing that outlives the process
            return
        copy = backup_sqlite(path, rev)
        print(f"k2bench: database {path} is at schema revision {rev}; upgrading it to {head}. "
              f"A copy from before the upgrade is kept at {copy}", file=sys.stderr)
        return
    dump = _pg_dump(conn.engine, rev)
    if not explicit:
        raise UserError(
            f"database {url} has schema revision {rev} and this k2bench needs {head}. k2bench does not copy a "
            f"PostgreSQL database: back it up first (e.g. `{dump}`), then run {_upgrade_hint(url)} once"
        )
    print(f"k2bench: upgrading {url} from schema revision {rev} to {head} in one transaction; k2bench makes "
          f"no copy of a PostgreSQL database (a backup: `{dump}`, taken before this)", file=sys.stderr)


def backup_sqlite(path: Path, rev: str) -> Path:
    """A consistent copy of the database file (WAL included) beside it: <name>.rev<rev>-<UTC time>.bak.

    Uses SQLite's online backup, which reads a snapshot while this process holds the write lock."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    copy = path.with_name(f"{path.name}.rev{rev}-{stamp}.bak")
    n = 1
    while copy.exists():
        copy = path.with_name(f"{path.name}.rev{rev}-{stamp}-{n}.bak")
        n += 1
    part = copy.with_name(copy.name + ".part")
    try:
        src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            dst = sqlite3.connect(part)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
        part.replace(copy)
    except (OSError, sqlite3.Error) as exc:
        part.unlink(missing_ok=True)
        raise UserError(f"database {path} needs an upgrade, and its copy {copy} could not be written ({exc}); "
                        "nothing was changed") from None
    return copy


def _foreign_keys(conn: Connection, on: bool) -> None:
    """Set SQLite's foreign_keys on the driver connection, outside any transaction (where it would be ignored)."""
    raw = conn.connection.dbapi_connection
    raw.execute(f"PRAGMA foreign_keys = {'ON' if on else 'OFF'}")
    state = raw.execute("PRAGMA foreign_keys").fetchone()[0]
    if bool(state) != on:
        raise RuntimeError(f"PRAGMA foreign_keys stayed {state}; refusing to touch the schema")


def _check_foreign_keys(conn: Connection, url: str, rev: str) -> None:
    bad = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if bad:
        where = sorted({f"{row[0]} -> {row[2]}" for row in bad})
        raise UserError(
            f"upgrade of {url} from schema revision {rev} stopped and rolled back: {len(bad)} row(s) point at rows "
            f"that do not exist ({', '.join(where)}); the database is unchanged"
        )


def _row_counts(conn: Connection) -> dict[str, int]:
    names = [n for n in inspect(conn).get_table_names() if n != "alembic_version"]
    quote = conn.dialect.identifier_preparer.quote
    return {n: conn.execute(text(f"SELECT COUNT(*) FROM {quote(n)}")).scalar_one() for n in names}


def _check_nothing_lost(before: dict[str, int], after: dict[str, int], url: str, rev: str) -> None:
    """No migration of ours deletes rows: a table that shrank or vanished means the upgrade went wrong."""
    lost = [f"{name} {n} -> {after.get(name, 0)}" for name, n in before.items() if after.get(name, 0) < n]
    if lost:
        raise UserError(
            f"upgrade of {url} from schema revision {rev} stopped and rolled back: it would have lost rows "
            f"({', '.join(lost)}); the database is unchanged"
        )
