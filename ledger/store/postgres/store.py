"""The shared ledger: PostgreSQL, for teams whose watcher and reconcilers run on several hosts.

Same contract as the SQLite store (ledger/store/base.py). How each guarantee is kept:

- Order, chaining, one round trip per append: recorder.py.
- Append-only: triggers refuse UPDATE, DELETE and TRUNCATE on `events` (so also upserts and
  MERGE), and the role `ledger_writer` (created when the connecting user may) holds
  SELECT/INSERT only on it (schema.sql, roles.sql).
- The chain only grows at its head, even for a writer that bypasses this code: an AFTER
  INSERT statement trigger checks each new row against the one before it (schema.sql).
- LISTEN/NOTIFY: a trigger on `head` notifies `<schema>_appended` with the new head seq, so
  `wait_for_append` sleeps until a commit instead of polling.
"""

from __future__ import annotations

import time

import psycopg
from psycopg import sql

from ledger.store.postgres.database import PgDatabase
from ledger.store.postgres.leases import PostgresLeases
from ledger.store.postgres.recorder import PostgresRecorder
from ledger.store.postgres.snapshots import PostgresCursors, PostgresSnapshots


class PostgresStore(PostgresRecorder, PostgresSnapshots, PostgresCursors):
    """Every part of the `Store` protocol on one ledger schema (the parts share one connection)."""

    def __init__(self, url: str, *, create: bool = True, schema: str | None = None) -> None:
        self._db = PgDatabase(url, create=create, schema=schema)
        self.url = url
        self.schema = self._db.schema
        self._listener: psycopg.Connection | None = None

    def wait_for_append(self, after: int, timeout: float) -> int:
        """Sleep on LISTEN until a commit moves the head past `after` (or timeout)."""
        deadline = time.monotonic() + timeout
        with self._db.lock:
            if self._listener is None:
                self._listener = self._db.connect()
                self._listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._db.channel)))
        # LISTEN is active before the head is read, so no commit can slip in unnoticed.
        while True:
            head = self.head()
            left = deadline - time.monotonic()
            if head > after or left <= 0:
                return head
            for _ in self._listener.notifies(timeout=left, stop_after=1):
                pass

    def leases(self) -> PostgresLeases:
        """This ledger's leases, on this store's connection."""
        return PostgresLeases(self._db)

    def close(self) -> None:
        with self._db.lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        self._db.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
