"""The embedded ledger's heartbeats (ledger/store/heartbeats.py): a table in the ledger file,
on a connection of their own, judged by this host's clock."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from ledger.store.heartbeats import Beat, Heartbeat
from ledger.store.sqlite.database import SideTable


class SQLiteHeartbeats(SideTable):
    queries_file = "heartbeats.sql"
    cache_kib = 256

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(path, clock=clock)
        with contextlib.suppress(sqlite3.OperationalError):  # a read-only file: readers see no rows until a service beats
            self._db.execute(self._q["create"])

    def beat(self, beat: Beat) -> None:
        lease = None if beat.lease_held is None else int(beat.lease_held)
        self._write("beat", (beat.instance, beat.component, beat.host, beat.pid, beat.version, beat.started,
                             self.clock(), lease))

    def stop(self, instance: str) -> None:
        self._write("stop", (self.clock(), instance))

    def all(self) -> list[Heartbeat]:
        try:
            rows = self._db.execute(self._q["all"], (self.clock(),)).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise
        return [Heartbeat(i, c, h, p, v, s, b, None if lease is None else bool(lease), stop, age)
                for i, c, h, p, v, s, b, lease, stop, age in rows]

    def forget(self, older_than: float) -> int:
        return self._write("forget", (self.clock() - older_than,))
