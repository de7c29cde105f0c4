"""The embedded ledger's snapshots and cursors (`Snapshots`, `Cursors` of ledger/store/base.py)."""

from __future__ import annotations

from ledger.store.base import Snapshot
from ledger.store.sqlite.database import SQLiteDatabase


def _snapshot(row: tuple) -> Snapshot:
    name, code_version, position, event_hash, state, hash_ = row
    return Snapshot(name, code_version, position, event_hash, bytes(state), hash_)


class SQLiteSnapshots(SQLiteDatabase):
    def save_snapshot(self, snapshot: Snapshot) -> None:
        with self._tx() as db:
            db.execute(self._q["save_snapshot"], (
                snapshot.name, snapshot.code_version, snapshot.position, snapshot.event_hash,
                snapshot.state, snapshot.hash,
            ))
            db.execute(self._q["prune_snapshots"], (snapshot.name,))

    def load_snapshot(self, name: str, code_version: str, at_most: int | None = None) -> Snapshot | None:
        row = self._db.execute(
            self._q["load_snapshot"], (name, code_version, at_most if at_most is not None else 2**62)
        ).fetchone()
        return _snapshot(row) if row else None

    def list_snapshots(self) -> list[Snapshot]:
        return [_snapshot(r) for r in self._db.execute(self._q["list_snapshots"])]

    def delete_snapshot(self, snapshot: Snapshot) -> None:
        with self._tx() as db:
            db.execute(self._q["delete_snapshot"], (snapshot.name, snapshot.code_version, snapshot.position))


class SQLiteCursors(SQLiteDatabase):
    def get_cursor(self, name: str) -> int:
        row = self._db.execute(self._q["get_cursor"], (name,)).fetchone()
        return row[0] if row else 0

    def set_cursor(self, name: str, position: int) -> None:
        with self._tx() as db:
            db.execute(self._q["set_cursor"], (name, position))
