"""Opening a database: URL defaults, SQLite settings, schema revisions (upgrades: upgrade.py).

SQLite runs in WAL mode (readers never block the writer) with a busy timeout, and every write
transaction starts with BEGIN IMMEDIATE: it takes the write lock up front, so two processes
writing at once queue on the busy timeout instead of failing on a lock upgrade.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from k2bench.errors import UserError

DEFAULT_DB_URL = "sqlite:///results/k2bench.db"
SQLITE_BUSY_TIMEOUT_MS = 60_000
SQLITE_PAGE_SIZE = 65_536
MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def default_db_url() -> str:
    """env K2BENCH_DB, else SQLite at results/k2bench.db (relative to the current directory)."""
    return os.environ.get("K2BENCH_DB") or DEFAULT_DB_URL


def safe_url(url: str | URL) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return str(url)


def parse_url(url: str) -> URL:
    try:
        return make_url(url)
    except (ArgumentError, ValueError):
        raise UserError(
            f"--db {url!r} is not a database URL (examples: sqlite:///results/k2bench.db, "
            "postgresql+psycopg2://user:pass@host/dbname)"
        ) from None


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL (None for in-memory databases)."""
    if url.get_backend_name() != "sqlite":
        return None
    db = url.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return Path(db)


def require_existing(url: URL) -> Path | None:
    """The SQLite file of url, which must exist (a command that does not create databases asked for it);
    None where url is no SQLite file."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise UserError(f"no k2bench database at {path} (a sweep or `k2bench import` creates one)")
    return path


def make_engines(url: URL, readonly: bool) -> tuple[Engine, Engine | None]:
    """(read engine, write engine); the write engine is None for a read-only store."""
    try:
        if url.get_backend_name() == "sqlite":
            if sqlite_path(url) is None:  # in-memory: one engine, or reads would see another database
                engine = _sqlite_engine(url, immediate=not readonly)
                return engine, None if readonly else engine
            return _sqlite_engine(url, immediate=False), None if readonly else _sqlite_engine(url, immediate=True)
        engine = create_engine(url, pool_pre_ping=True)
        return engine, None if readonly else engine
    except NoSuchModuleError:
        raise UserError(f"database URL {safe_url(url)}: unknown database kind {url.drivername!r}") from None
    except ImportError as exc:
        hint = "; pip install 'k2bench[postgres]'" if url.get_backend_name() == "postgresql" else ""
        raise UserError(
            f"database URL {safe_url(url)}: its driver is not installed ({exc.name or exc}){hint}"
        ) from None
    except (ArgumentError, SQLAlchemyError) as exc:
        raise UserError(f"database URL {safe_url(url)}: {first_line(exc)}") from None


def _sqlite_engine(url: URL, immediate: bool) -> Engine:
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy, not the driver, decide when transactions begin (see _on_begin).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        # Only takes effect when the file is created: big pages pack the ~3 KB stamp blobs of
        # the requests table tightly (with 4 KB pages each blob would waste most of a page).
        cur.execute(f"PRAGMA page_size = {SQLITE_PAGE_SIZE}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def first_line(exc: BaseException) -> str:
    """A driver error reduced to its first meaningful line (no SQL, no traceback)."""
    orig = getattr(exc, "orig", None)
    text_ = str(orig if orig is not None else exc).strip()
    return text_.splitlines()[0] if text_ else type(exc).__name__


def alembic_config(connection: Connection | None = None):
    """Alembic's configuration: our migrations folder, and the connection env.py should use."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _scripts():
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    return _scripts().get_current_head()


def known_revisions() -> set[str]:
    return {script.revision for script in _scripts().walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    if not inspect(connection).has_table("alembic_version"):
        return None
    return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def upgrade_to(connection: Connection, revision: str) -> None:
    """Run the migrations up to ``revision`` on a connection inside its transaction (see upgrade.py for
    the safeguards around it)."""
    from alembic import command

    command.upgrade(alembic_config(connection), revision)
