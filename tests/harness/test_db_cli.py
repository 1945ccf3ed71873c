"""Reading commands never upgrade; `k2bench db status|upgrade`; an upgrade that would break foreign keys
stops and leaves the database as it was. Through the real CLI entry point."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from migration_helpers import build_at, fill, revision_of, revisions, stored
from sqlalchemy import create_engine, text

from k2bench.errors import UserError
from k2bench.harness.cli import main
from k2bench.harness.store import Store, db

OLDEST, PREVIOUS = revisions()[0], revisions()[-2]
FIXTURE = Path(__file__).parent / "fixtures" / "run_small.json"


@pytest.fixture
def path(tmp_path):
    return tmp_path / "k2bench.db"


def _old_db(path, rev: str = OLDEST) -> tuple[str, dict]:
    url = f"sqlite:///{path}"
    build_at(url, rev)
    return url, fill(url)


@pytest.mark.parametrize("argv", [["runs"], ["show", "1"], ["export", "1", "--json", "OUT"], ["db", "status"],
                                  ["regress", "--candidate", "abc"], ["changepoints"]])
@pytest.mark.parametrize("rev", [OLDEST, PREVIOUS])
def test_reading_commands_refuse_an_old_database_and_leave_it(path, tmp_path, argv, rev, capsys):
    url, before = _old_db(path, rev)
    argv = [str(tmp_path / "out.json") if a == "OUT" else a for a in argv]
    code = main([*argv, "--db", url])
    out, err = capsys.readouterr()
    if argv[0] == "db":
        assert code == 0 and f"schema revision {rev}, older" in out and "k2bench db upgrade" in out
    else:
        assert code == 2, (out, err)
        assert f"schema revision {rev}" in err and "only read never upgrade" in err and "k2bench db upgrade" in err, err
        assert err.count("\n") == 1, err
    assert revision_of(url) == rev
    assert stored(url, before) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["k2bench.db", *_sidecars(tmp_path)])


def _sidecars(folder) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name in ("k2bench.db-wal", "k2bench.db-shm")]


def test_a_newer_database_says_upgrade_k2bench(path, capsys):
    url = f"sqlite:///{path}"
    Store.open(url).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    for argv in (["runs"], ["show", "1"], ["import", str(FIXTURE)], ["db", "upgrade"]):
        assert main([*argv, "--db", url]) == 2, argv
        err = capsys.readouterr().err
        assert "9999" in err and "written by a newer k2bench; upgrade k2bench" in err, err
        assert "read-write" not in err and "db upgrade" not in err, err
    assert main(["db", "status", "--db", url]) == 0
    assert "newer than this k2bench" in capsys.readouterr().out
    assert revision_of(url) == "9999"


def test_db_upgrade_keeps_a_copy_and_says_so(path, tmp_path, capsys):
    url, before = _old_db(path)
    assert main(["db", "upgrade", "--db", url]) == 0
    out, err = capsys.readouterr()
    head = db.head_revision()
    assert f"upgraded from schema revision {OLDEST} to {head}" in out
    (copy,) = tmp_path.glob(f"k2bench.db.rev{OLDEST}-*.bak")
    assert str(copy) in err
    assert revision_of(url) == head and stored(url, before) == before
    assert main(["db", "upgrade", "--db", url]) == 0
    assert "already at schema revision" in capsys.readouterr().out
    assert main(["db", "status", "--db", url]) == 0
    assert f"schema revision {head}, up to date" in capsys.readouterr().out
    assert main(["runs", "--db", url]) == 0  # readable now


def test_db_upgrade_of_a_missing_file_creates_nothing(path, capsys):
    assert main(["db", "upgrade", "--db", f"sqlite:///{path}"]) == 2
    assert "no k2bench database" in capsys.readouterr().err
    assert not path.exists()


def test_broken_foreign_keys_stop_the_upgrade(path, tmp_path):
    """A request pointing at a level that does not exist: the upgrade rolls back, the copy stays."""
    url, before = _old_db(path)
    raw = sqlite3.connect(path)
    raw.execute("UPDATE requests SET point_id = 999 WHERE id = 5")  # foreign keys are off by default here
    raw.commit()
    raw.close()
    before["requests"][4]["point_id"] = 999
    with pytest.raises(UserError, match=r"stopped and rolled back: 1 row\(s\) point at rows that do not exist "
                                        r"\(requests -> points\); the database is unchanged"):
        Store.open(url)
    assert revision_of(url) == OLDEST
    assert stored(url, before) == before
    assert len(list(tmp_path.glob("k2bench.db.rev*.bak"))) == 1


def test_foreign_keys_are_back_on_after_an_upgrade(path):
    """The upgrade turns foreign keys off on its connection; the pool hands that connection on, so it must
    get them back."""
    url, _ = _old_db(path)
    with Store.open(url) as store, store._write() as session:
        assert session.execute(text("PRAGMA foreign_keys")).scalar() == 1


def test_a_writing_command_upgrades_after_a_copy(path, tmp_path, capsys):
    url, before = _old_db(path)
    assert main(["import", str(FIXTURE), "--db", url]) == 0
    out, err = capsys.readouterr()
    (copy,) = tmp_path.glob(f"k2bench.db.rev{OLDEST}-*.bak")
    assert f"schema revision {OLDEST}; upgrading it to {db.head_revision()}" in err and str(copy) in err
    assert "imported" in out
    after = stored(url, before)  # the old rows as they were, the imported run after them
    assert {name: rows[:len(before[name])] for name, rows in after.items()} == before
    assert len(after["runs"]) == len(before["runs"]) + 1
