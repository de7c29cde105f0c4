"""The embedded ledger: one SQLite file, append-only enforced by triggers (triggers.sql)."""

from __future__ import annotations

import time

from ledger.store.sqlite.leases import SQLiteLeases
from ledger.store.sqlite.recorder import SQLiteRecorder
from ledger.store.sqlite.snapshots import SQLiteCursors, SQLiteSnapshots


class SQLiteStore(SQLiteRecorder, SQLiteSnapshots, SQLiteCursors):
    """Every part of the `Store` protocol on one file (the parts share one connection)."""

    def wait_for_append(self, after: int, timeout: float) -> int:
        # SQLite has no notifications across processes: poll the head (an index lookup).
        deadline = time.monotonic() + timeout
        while True:
            head = self.head()
            if head > after or time.monotonic() >= deadline:
                return head
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def leases(self) -> SQLiteLeases:
        """This ledger's leases, on a connection of their own (close them when done)."""
        return SQLiteLeases(self.path)

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
