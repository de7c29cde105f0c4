"""Leases: who acts on what, for how long. Kept beside the events, never in them.

A lease is a named, time-limited claim (`job:alice/train` held by `reconciler@host-a:4242`
for 15 s). Several reconcilers on one ledger use them to spread jobs and to take over a dead
one's jobs once its leases lapse; expected-version appends stay the fence that makes a late
write by a holder who lost its lease fail.

- `acquire(name, holder, ttl)`: True if `holder` now holds it (it was free, expired, or
  already its own: then it is renewed). Atomic: two contenders never both win.
- `renew(name, holder, ttl)`: True only while `holder` still holds it unexpired; False means
  stop acting on it.
- `release(name, holder)`: True if it was held by `holder`; the lease is free at once.
- `get(name)` / `all()`: the current `Lease` rows (expired ones included, `live` says).

`token` grows by one every time a lease changes hands (fencing token); it never goes back.
Expiry is judged by one clock: the database server's for PostgreSQL (hosts' clocks may
differ), this host's for SQLite (one host by nature).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Protocol

from ledger.errors import StoreError


@dataclass(frozen=True, slots=True)
class Lease:
    name: str
    holder: str  # "" once released
    expires_at: float  # seconds since the epoch, by the judging clock
    token: int
    live: bool


class Leases(Protocol):
    def acquire(self, name: str, holder: str, ttl: float) -> bool: ...

    def renew(self, name: str, holder: str, ttl: float) -> bool: ...

    def release(self, name: str, holder: str) -> bool: ...

    def get(self, name: str) -> Lease | None: ...

    def all(self) -> list[Lease]: ...


def _check(holder: str, ttl: float | None = None) -> None:
    if not holder:
        raise StoreError("a lease holder needs a non-empty name")
    if ttl is not None and not ttl > 0:
        raise StoreError(f"lease ttl must be > 0 seconds, got {ttl}")


class PostgresLeases:
    """Leases in the `leases` table of a PostgresStore's schema, judged by the server clock."""

    def __init__(self, store) -> None:
        self.store = store

    def acquire(self, name: str, holder: str, ttl: float) -> bool:
        _check(holder, ttl)
        rows = self.store.execute(
            "INSERT INTO {s}.leases AS l (name, holder, expires_at, token) "
            "VALUES (%s, %s, clock_timestamp() + make_interval(secs => %s), 1) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at, "
            "token = CASE WHEN l.holder = excluded.holder THEN l.token ELSE l.token + 1 END "
            "WHERE l.holder = excluded.holder OR l.expires_at <= clock_timestamp() RETURNING token",
            (name, holder, float(ttl)),
        )
        return bool(rows)

    def renew(self, name: str, holder: str, ttl: float) -> bool:
        _check(holder, ttl)
        rows = self.store.execute(
            "UPDATE {s}.leases SET expires_at = clock_timestamp() + make_interval(secs => %s) "
            "WHERE name = %s AND holder = %s AND expires_at > clock_timestamp() RETURNING token",
            (float(ttl), name, holder),
        )
        return bool(rows)

    def release(self, name: str, holder: str) -> bool:
        _check(holder)
        # The row stays (holder "" and expired) so the next holder's token still grows.
        rows = self.store.execute(
            "UPDATE {s}.leases SET holder = '', expires_at = clock_timestamp() "
            "WHERE name = %s AND holder = %s RETURNING token",
            (name, holder),
        )
        return bool(rows)

    _SELECT = (
        "SELECT name, holder, extract(epoch FROM expires_at)::float8, token, "
        "holder <> '' AND expires_at > clock_timestamp() FROM {s}.leases"
    )

    def get(self, name: str) -> Lease | None:
        rows = self.store.execute(self._SELECT + " WHERE name = %s", (name,))
        return Lease(*rows[0]) if rows else None

    def all(self) -> list[Lease]:
        return [Lease(*r) for r in self.store.execute(self._SELECT + " ORDER BY name")]


SQLITE_LEASES = """
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL,
    token INTEGER NOT NULL
)
"""


class SQLiteLeases:
    """Leases in a `leases` table of the SQLite ledger file, on a connection of their own."""

    def __init__(self, store, *, clock=time.time) -> None:
        self.path = store.path
        self.clock = clock
        self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout = 30000")
        self._db.execute(SQLITE_LEASES)

    def _write(self, query: str, params: tuple) -> bool:
        # BEGIN IMMEDIATE: the read of the old row and the write are one step for all processes.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            changed = self._db.execute(query, params).rowcount
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return changed > 0

    def acquire(self, name: str, holder: str, ttl: float) -> bool:
        _check(holder, ttl)
        now = self.clock()
        return self._write(
            "INSERT INTO leases (name, holder, expires_at, token) VALUES (?, ?, ?, 1) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at, "
            "token = CASE WHEN leases.holder = excluded.holder THEN leases.token ELSE leases.token + 1 END "
            "WHERE leases.holder = excluded.holder OR leases.expires_at <= ?",
            (name, holder, now + ttl, now),
        )

    def renew(self, name: str, holder: str, ttl: float) -> bool:
        _check(holder, ttl)
        now = self.clock()
        return self._write(
            "UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ? AND expires_at > ?",
            (now + ttl, name, holder, now),
        )

    def release(self, name: str, holder: str) -> bool:
        _check(holder)
        return self._write(
            "UPDATE leases SET holder = '', expires_at = ? WHERE name = ? AND holder = ?",
            (self.clock(), name, holder),
        )

    def _lease(self, row: tuple) -> Lease:
        name, holder, expires_at, token = row
        return Lease(name, holder, expires_at, token, bool(holder) and expires_at > self.clock())

    def get(self, name: str) -> Lease | None:
        row = self._db.execute("SELECT name, holder, expires_at, token FROM leases WHERE name = ?", (name,)).fetchone()
        return self._lease(row) if row else None

    def all(self) -> list[Lease]:
        rows = self._db.execute("SELECT name, holder, expires_at, token FROM leases ORDER BY name").fetchall()
        return [self._lease(r) for r in rows]

    def close(self) -> None:
        self._db.close()


def leases_for(store) -> Leases:
    """The lease table that lives beside `store`'s events (PostgreSQL or SQLite)."""
    from ledger.store.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return SQLiteLeases(store)
    from ledger.store.postgres import PostgresStore  # psycopg only when PostgreSQL is used

    if isinstance(store, PostgresStore):
        return PostgresLeases(store)
    raise StoreError(f"no leases for store {type(store).__name__}")
