"""The shared ledger's snapshots and cursors (`Snapshots`, `Cursors` of ledger/store/base.py)."""

from __future__ import annotations

from ledger.store.base import Snapshot
from ledger.store.postgres.database import PgDatabase


def _snapshot(row: tuple) -> Snapshot:
    name, code_version, position, event_hash, state, hash_ = row
    return Snapshot(name, code_version, position, event_hash, bytes(state), hash_)


class PostgresSnapshots:
    _db: PgDatabase

    def save_snapshot(self, snapshot: Snapshot) -> None:
        db = self._db
        with db.lock, db.conn.transaction():
            db.conn.execute(db.q["save_snapshot"], (  # type: ignore[arg-type]
                snapshot.name, snapshot.code_version, snapshot.position, snapshot.event_hash,
                snapshot.state, snapshot.hash,
            ))
            db.conn.execute(db.q["prune_snapshots"], {"name": snapshot.name})  # type: ignore[arg-type]

    def load_snapshot(self, name: str, code_version: str, at_most: int | None = None) -> Snapshot | None:
        rows = self._db.execute(self._db.q["load_snapshot"], (name, code_version, at_most if at_most is not None else 2**62))
        return _snapshot(rows[0]) if rows else None

    def list_snapshots(self) -> list[Snapshot]:
        return [_snapshot(r) for r in self._db.execute(self._db.q["list_snapshots"])]

    def delete_snapshot(self, snapshot: Snapshot) -> None:
        self._db.execute(self._db.q["delete_snapshot"], (snapshot.name, snapshot.code_version, snapshot.position))


class PostgresCursors:
    _db: PgDatabase

    def get_cursor(self, name: str) -> int:
        rows = self._db.execute(self._db.q["get_cursor"], (name,))
        return rows[0][0] if rows else 0

    def set_cursor(self, name: str, position: int) -> None:
        self._db.execute(self._db.q["set_cursor"], (name, position))
