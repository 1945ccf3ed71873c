"""`k2bench db status` and `k2bench db upgrade`: a database's schema revision, and upgrading it on purpose.

Commands that only read (runs, show, export, regress, dashboard, ...) never upgrade a database; this is
the command their error names. Heavy imports (sqlalchemy, alembic) happen inside the handlers.
"""

from __future__ import annotations

import argparse

from k2bench.harness.commands.common import add_db_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="the database's schema revision; upgrade it",
                       description="A database written by an older k2bench is upgraded by writing commands "
                                   "(sweep, import, ...) or by `k2bench db upgrade`; commands that only read "
                                   "refuse it. A SQLite file is copied beside itself before any upgrade.")
    actions = p.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    s = actions.add_parser("status", help="the database's schema revision against this k2bench's")
    add_db_arg(s)
    s.set_defaults(handler=_status)
    u = actions.add_parser("upgrade", help="upgrade the schema to this k2bench's (SQLite: a copy is kept first)",
                           description="Upgrade the database's schema to this k2bench's newest revision in one "
                                       "transaction. A SQLite file is first copied beside itself as "
                                       "NAME.rev<OLD>-<UTC time>.bak; a PostgreSQL database is not copied: take a "
                                       "pg_dump first. The only way to upgrade a PostgreSQL database.")
    add_db_arg(u)
    u.set_defaults(handler=_upgrade)


def _status(args) -> int:
    from k2bench.harness.store import db, upgrade

    url = args.db or db.default_db_url()
    rev, head = upgrade.database_revision(url), db.head_revision()
    where = f"database {db.safe_url(url)}"
    if rev is None:
        print(f"{where}: no k2bench tables yet; this k2bench's schema revision is {head}")
    elif rev == head:
        print(f"{where}: schema revision {rev}, up to date")
    elif rev not in db.known_revisions():
        print(f"{where}: schema revision {rev}, newer than this k2bench ({head}): upgrade k2bench")
    else:
        print(f"{where}: schema revision {rev}, older than this k2bench's {head}: `k2bench db upgrade` upgrades it")
    return 0


def _upgrade(args) -> int:
    from k2bench.harness.store import db, upgrade

    url = args.db or db.default_db_url()
    before = upgrade.database_revision(url)
    upgrade.upgrade_database(url)
    head = db.head_revision()
    if before == head:
        print(f"database {db.safe_url(url)} is already at schema revision {head}; nothing to do")
    elif before is None:
        print(f"database {db.safe_url(url)} created at schema revision {head}")
    else:
        print(f"database {db.safe_url(url)} upgraded from schema revision {before} to {head}")
    return 0
