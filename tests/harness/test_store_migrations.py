"""Upgrading a database written at any earlier schema revision loses nothing.

For every revision the migrations folder holds (read from Alembic, so a new migration is picked up
without editing this file), the test builds a database at that revision with Alembic's own
`upgrade <rev>`, fills every table it has with rows made from the reflected columns of that
revision, upgrades it the way k2bench does, and compares every stored value (helpers in
migration_helpers.py). SQLite, and PostgreSQL when K2BENCH_TEST_PG_URL is set."""

from __future__ import annotations

import re

import pytest
from migration_helpers import ROWS, build_at, fill, revision_of, revisions, stored

from k2bench.harness.store import Store, db
from k2bench.harness.store.upgrade import upgrade_database

OLD = revisions()[:-1]



@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'k2bench.db'}"
    return request.getfixturevalue("pg_url")


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


def test_reading_never_upgrades(url):
    """A read-only open of an older database refuses and changes nothing; on PostgreSQL it says to back up
    with pg_dump first, and a read-write open refuses too (PostgreSQL upgrades only through `k2bench db upgrade`)."""
    from k2bench.errors import UserError

    rev = OLD[-1]
    build_at(url, rev)
    before = fill(url)
    with pytest.raises(UserError, match=f"revision {rev}.*only read never upgrade.*k2bench db upgrade") as info:
        Store.open(url, readonly=True)
    assert ("pg_dump" in str(info.value)) == url.startswith("postgresql")
    if url.startswith("postgresql"):
        with pytest.raises(UserError, match="does not copy a PostgreSQL database.*pg_dump"):
            Store.open(url)
    assert revision_of(url) == rev and stored(url, before) == before
