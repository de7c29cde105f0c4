"""verify.TailCheck, the cheap soundness signal of a running service: it reads only what was
appended since its last call, and finds an altered, unlinked or removed event there."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ledger.events import NewEvent
from ledger.store.sqlite import SQLiteStore
from ledger.verify import TailCheck


def _note(store: SQLiteStore, text: str) -> int:
    store.append("_system", [NewEvent("note", {"text": text})])
    return store.head()


def _unguarded(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.execute("DROP TRIGGER events_no_update")
    db.execute("DROP TRIGGER events_no_delete")
    return db


def test_appends_check_out_and_only_new_rows_are_read(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "l.db")
    check = TailCheck()
    assert check.check(store) is None and check.after == 0  # an empty ledger
    for i in range(5):
        _note(store, f"n{i}")
        assert check.check(store) is None
    assert check.after == 5
    store.close()


def test_an_altered_new_event_is_found(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "l.db")
    _note(store, "a")
    check = TailCheck()
    assert check.check(store) is None
    head = _note(store, "b")
    db = _unguarded(tmp_path / "l.db")
    db.execute("UPDATE events SET data = ? WHERE seq = ?", ('{"text":"B"}', head))
    db.commit()
    problem = check.check(store)
    assert problem is not None and problem.position == head and "hash mismatch" in problem.reason
    assert check.check(store) is problem  # kept: the ledger does not heal
    store.close()


def test_a_removed_event_is_found(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "l.db")
    for i in range(3):
        _note(store, f"n{i}")
    check = TailCheck()
    assert check.check(store) is None and check.after == 3
    db = _unguarded(tmp_path / "l.db")
    db.execute("DELETE FROM events WHERE seq = 3")
    db.commit()
    problem = check.check(store)
    assert problem is not None and "went back" in problem.reason
    store.close()
