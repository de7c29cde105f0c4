"""The embedded ledger's leases (ledger/store/leases.py): a table in the ledger file, on a
connection of their own, judged by this host's clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ledger.store.leases import Lease, check_lease
from ledger.store.sqlite.database import SideTable


class SQLiteLeases(SideTable):
    queries_file = "leases.sql"
    cache_kib = 2048

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(path, clock=clock)
        self._db.execute(self._q["create"])

    def acquire(self, name: str, holder: str, ttl: float) -> bool:
        check_lease(holder, ttl)
        now = self.clock()
        return self._write("acquire", (name, holder, now + ttl, now)) > 0

    def renew(self, name: str, holder: str, ttl: float) -> bool:
        check_lease(holder, ttl)
        now = self.clock()
        return self._write("renew", (now + ttl, name, holder, now)) > 0

    def release(self, name: str, holder: str) -> bool:
        check_lease(holder)
        return self._write("release", (self.clock(), name, holder)) > 0

    def _lease(self, row: tuple) -> Lease:
        name, holder, expires_at, token = row
        return Lease(name, holder, expires_at, token, bool(holder) and expires_at > self.clock())

    def get(self, name: str) -> Lease | None:
        row = self._db.execute(self._q["get"], (name,)).fetchone()
        return self._lease(row) if row else None

    def all(self) -> list[Lease]:
        return [self._lease(r) for r in self._db.execute(self._q["all"])]
