"""What the SQLite file itself refuses, whoever writes (a raw sqlite3 connection, the sqlite3
shell), and how an older file is upgraded in place by `ledger upgrade` (and by nothing else)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess

import pytest

from ledger.errors import StoreError
from ledger.events import NewEvent, actor
from ledger.store import upgrade_store
from ledger.store.base import FORMAT_VERSION
from ledger.store.sqlite import SQLiteStore, database, recorder
from ledger.verify import verify_store

WHO = actor("cli", "tester")
COLUMNS = "seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash"


@pytest.fixture
def ledger(tmp_path):
    store = SQLiteStore(tmp_path / "ledger.db")
    store.append("alice/a", [NewEvent("note", {"text": str(i)}, WHO) for i in range(2)])
    store.append("bob/b", [NewEvent("note", {"text": "2"}, WHO)])
    rows = list(store.raw_rows())
    store.close()
    return tmp_path / "ledger.db", rows


def head_plus_one(rows, *, stream: str, version: int, id_: str) -> str:
    """A row that extends the chain exactly (next seq, chained to the head), under `id_`."""
    last = rows[-1]
    return (f"({len(rows) + 1}, '{stream}', {version}, 'note', '{last[4]}', '{{}}', '{id_}', NULL, '{{}}', "
            f"'{last[10]}', '{'0' * 64}')")


def unchanged(path, rows) -> None:
    store = SQLiteStore(path)
    try:
        assert list(store.raw_rows()) == rows
        assert verify_store(store).ok
    finally:
        store.close()


def refusals(rows) -> list[tuple[str, str]]:
    first, second = rows[0], rows[1]
    return [
        # REPLACE at head+1 reusing seq 1's id: would delete seq 1 without a delete trigger firing.
        (f"INSERT OR REPLACE INTO events ({COLUMNS}) VALUES "
         + head_plus_one(rows, stream="alice/a", version=3, id_=first[6]), "stored already"),
        (f"REPLACE INTO events ({COLUMNS}) VALUES " + head_plus_one(rows, stream="carol/c", version=1, id_=second[6]),
         "stored already"),
        # Reusing a (stream, version): not the stream's next version, so not at the head.
        (f"INSERT OR REPLACE INTO events ({COLUMNS}) VALUES "
         + head_plus_one(rows, stream="alice/a", version=1, id_="fresh-id"), "only grows at its head"),
        (f"INSERT INTO events ({COLUMNS}) VALUES " + head_plus_one(rows, stream="alice/a", version=3, id_=first[6])
         + " ON CONFLICT (id) DO UPDATE SET data = excluded.data", "stored already"),
        (f"UPDATE OR REPLACE events SET id = '{first[6]}' WHERE seq = 2", "cannot be updated"),
        ("DELETE FROM events", "cannot be deleted"),
    ]


@pytest.mark.parametrize("recursive_triggers", [False, True])
def test_no_write_through_a_raw_connection_removes_a_row(ledger, recursive_triggers):
    path, rows = ledger
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute(f"PRAGMA recursive_triggers = {'ON' if recursive_triggers else 'OFF'}")
        for statement, message in refusals(rows):
            with pytest.raises(sqlite3.IntegrityError, match=message):
                db.execute(statement)
    finally:
        db.close()
    unchanged(path, rows)


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="no sqlite3 shell installed")
def test_the_sqlite3_shell_cannot_replace_a_row_either(ledger):
    path, rows = ledger
    statement, _ = refusals(rows)[0]
    done = subprocess.run(["sqlite3", str(path), statement + ";"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "stored already" in done.stderr
    unchanged(path, rows)


def test_a_format_4_ledger_is_upgraded_by_recording_the_format_alone(ledger):
    """Format 5 changed only PostgreSQL: a format-4 SQLite file keeps its rows, triggers and
    snapshots; `ledger upgrade` records the format, and the rules hold as before."""
    path, rows = ledger
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE meta SET value = '4' WHERE key = 'format'")
    before = db.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
    db.close()
    with pytest.raises(StoreError, match=f"has format 4, older than this tpu-ledger's format {FORMAT_VERSION}"):
        SQLiteStore(path)
    assert upgrade_store(f"sqlite:///{path}") == (4, FORMAT_VERSION)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone() == (str(FORMAT_VERSION),)
        assert db.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall() == before
        with pytest.raises(sqlite3.IntegrityError, match="stored already"):
            db.execute(refusals(rows)[0][0])
    finally:
        db.close()
    unchanged(path, rows)


def test_a_format_2_ledger_is_upgraded_in_place_by_ledger_upgrade(ledger):
    path, rows = ledger
    db = sqlite3.connect(path, isolation_level=None)
    # What a format-2 file holds: the growth trigger without the id check, and unchecked snapshots.
    db.executescript(f"""
        BEGIN;
        DROP TRIGGER events_contiguous;
        CREATE TRIGGER events_contiguous BEFORE INSERT ON events
        WHEN NEW.seq IS NOT (SELECT IFNULL(MAX(seq), 0) + 1 FROM events)
          OR NEW.version IS NOT (SELECT IFNULL(MAX(version), 0) + 1 FROM events WHERE stream = NEW.stream)
          OR NEW.prev_hash IS NOT IFNULL((SELECT hash FROM events WHERE seq = NEW.seq - 1), '{'0' * 64}')
        BEGIN SELECT RAISE(ABORT, 'the ledger only grows at its head'); END;
        DROP TABLE snapshots;
        CREATE TABLE snapshots (name TEXT NOT NULL, code_version TEXT NOT NULL, position INTEGER NOT NULL,
                                state BLOB NOT NULL, PRIMARY KEY (name, code_version, position));
        INSERT INTO snapshots VALUES ('ledger', 'old', 3, X'00');
        UPDATE meta SET value = '2' WHERE key = 'format';
        COMMIT;
    """)
    db.close()
    with pytest.raises(StoreError, match=f"has format 2, older than this tpu-ledger's format {FORMAT_VERSION}"):
        SQLiteStore(path)  # opening it is not upgrading it
    assert upgrade_store(f"sqlite:///{path}", dry_run=True) == (2, FORMAT_VERSION)
    assert upgrade_store(f"sqlite:///{path}") == (2, FORMAT_VERSION)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone() == (str(FORMAT_VERSION),)
        columns = [r[1] for r in db.execute("PRAGMA table_info(snapshots)")]
        assert columns == ["name", "code_version", "position", "event_hash", "state", "hash"]
        assert db.execute("SELECT COUNT(*) FROM snapshots").fetchone() == (0,)  # unchecked ones dropped
        with pytest.raises(sqlite3.IntegrityError, match="stored already"):
            db.execute(refusals(rows)[0][0])
    finally:
        db.close()
    unchanged(path, rows)


def test_a_batch_fits_the_librarys_limit_of_bound_values(tmp_path, monkeypatch):
    """SQLite before 3.32 (Ubuntu 20.04's) binds at most 999 values a statement: a batch of
    100 events or more was one statement of 1,100 ("too many SQL variables"). The same real
    library with its limit set there must append them, in order, and verify."""
    connect = database.connect

    def as_sqlite_3_31(path, *, cache_kib):  # noqa: ANN001, ANN202 - database.connect's
        db = connect(path, cache_kib=cache_kib)
        db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        return db

    monkeypatch.setattr(database, "connect", as_sqlite_3_31)
    monkeypatch.setattr(recorder, "connect", as_sqlite_3_31)
    store = SQLiteStore(tmp_path / "ledger.db")
    try:
        store.append_many([(f"alice/j{i:03d}", [NewEvent("note", {"text": str(i)}, WHO)], 0) for i in range(250)])
        assert [e.stream for e in store.read_all()] == [f"alice/j{i:03d}" for i in range(250)]
        assert verify_store(store).ok
    finally:
        store.close()
