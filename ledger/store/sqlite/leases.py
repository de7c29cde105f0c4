"""The embedded ledger's leases (ledger/store/leases.py): a table in the ledger file, on a
connection of their own, judged by this host's clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ledger.store import sqlfiles
from ledger.store.leases import Lease, check_lease
from ledger.store.sqlite.database import PACKAGE, connect, write_transaction


class SQLiteLeases:
    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.clock = clock
        self._q = sqlfiles.queries(PACKAGE, "leases.sql")
        self._db = connect(self.path, cache_kib=2048)
        self._db.execute(self._q["create"])

    def _write(self, query: str, params: tuple) -> bool:
        # One write transaction: the read of the old row and the write are one step for all processes.
        with write_transaction(self._db, self.path) as db:
            return db.execute(self._q[query], params).rowcount > 0

    def acquire(self, name: str, holder: str, ttl: float) -> bool:
        check_lease(holder, ttl)
        now = self.clock()
        return self._write("acquire", (name, holder, now + ttl, now))

    def renew(self, name: str, holder: str, ttl: float) -> bool:
        check_lease(holder, ttl)
        now = self.clock()
        return self._write("renew", (now + ttl, name, holder, now))

    def release(self, name: str, holder: str) -> bool:
        check_lease(holder)
        return self._write("release", (self.clock(), name, holder))

    def _lease(self, row: tuple) -> Lease:
        name, holder, expires_at, token = row
        return Lease(name, holder, expires_at, token, bool(holder) and expires_at > self.clock())

    def get(self, name: str) -> Lease | None:
        row = self._db.execute(self._q["get"], (name,)).fetchone()
        return self._lease(row) if row else None

    def all(self) -> list[Lease]:
        return [self._lease(r) for r in self._db.execute(self._q["all"])]

    def close(self) -> None:
        self._db.close()
