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

import contextlib
import sqlite3
import threading
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

    def close(self) -> None: ...


def _check(holder: str, ttl: float | None = None) -> None:
    if not holder:
        raise StoreError("a lease holder needs a non-empty name")
    if ttl is not None and not ttl > 0:
        raise StoreError(f"lease ttl must be > 0 seconds, got {ttl}")


class PostgresLeases:
    """Leases in the `leases` table of a PostgresStore's schema, judged by the server clock."""

    def __init__(self, store, *, owns_store: bool = False) -> None:
        self.store = store
        self._owns = owns_store

    def close(self) -> None:
        if self._owns:
            self.store.close()

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

    def __init__(self, store, *, clock=time.time, owns_store: bool = False) -> None:
        self.path = store.path
        self._store = store if owns_store else None
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
        if self._store is not None:
            self._store.close()


def open_leases(url: str) -> Leases:
    """Leases of the ledger at `url` on a connection of their own; `close()` when done."""
    from ledger.store import open_store

    store = open_store(url)
    try:
        return leases_for(store, owns_store=True)
    except BaseException:
        store.close()
        raise


def leases_for(store, *, owns_store: bool = False) -> Leases:
    """The lease table that lives beside `store`'s events (PostgreSQL or SQLite)."""
    from ledger.store.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return SQLiteLeases(store, owns_store=owns_store)
    from ledger.store.postgres import PostgresStore  # psycopg only when PostgreSQL is used

    if isinstance(store, PostgresStore):
        return PostgresLeases(store, owns_store=owns_store)
    raise StoreError(f"no leases for store {type(store).__name__}")


class LeaseKeeper:
    """Keeps one holder's leases alive: `claim` takes a lease, a thread renews every claimed
    lease each ttl/3, `holds` says whether acting on it is still safe, `release` gives it up.

    `holds` is judged conservatively on this host's monotonic clock: a lease counts as held
    only until ttl minus a margin after the start of the last successful acquire or renew
    request, so a holder cut off from the database stops acting before anyone else can take
    the lease over. Appends with expected versions remain the fence for a write in flight.

    A reconciler uses it as: `if keeper.claim(f"job:{job_id}"): act ...`; and after the
    action, or when the job is done, `keeper.release(...)`. A dead reconciler's jobs are
    claimable by the others at most `ttl` after its last renewal.
    """

    def __init__(self, leases_factory, holder: str, ttl: float = 15.0, *, margin: float | None = None) -> None:
        _check(holder, ttl)
        self.holder = holder
        self.ttl = ttl
        self.margin = margin if margin is not None else ttl / 5
        self._factory = leases_factory
        self._leases = leases_factory()  # for claim/release (the caller's thread)
        self._held: dict[str, float] = {}  # name -> monotonic deadline
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name=f"leases-{holder}", daemon=True)
        self._thread.start()

    def claim(self, name: str) -> bool:
        started = time.monotonic()
        with self._lock:
            ok = self._leases.acquire(name, self.holder, self.ttl)
            if ok:
                self._held[name] = started + self.ttl - self.margin
            else:
                self._held.pop(name, None)
            return ok

    def holds(self, name: str) -> bool:
        with self._lock:
            deadline = self._held.get(name)
        return deadline is not None and time.monotonic() < deadline

    def held(self) -> list[str]:
        now_ = time.monotonic()
        with self._lock:
            return sorted(n for n, d in self._held.items() if d > now_)

    def release(self, name: str) -> None:
        with self._lock:
            self._held.pop(name, None)
            self._leases.release(name, self.holder)

    def _renew_loop(self) -> None:
        leases = None
        try:
            while not self._stop.wait(self.ttl / 3):
                with self._lock:
                    names = list(self._held)
                if leases is None:
                    try:
                        leases = self._factory()
                    except Exception:  # unreachable for now: deadlines run out meanwhile
                        continue
                for name in names:
                    started = time.monotonic()
                    try:
                        ok = leases.renew(name, self.holder, self.ttl)
                    except Exception:  # the database is unreachable: the deadline runs out
                        continue
                    with self._lock:
                        if name not in self._held:
                            continue
                        if ok:
                            self._held[name] = started + self.ttl - self.margin
                        else:
                            del self._held[name]  # lost (expired and taken): stop acting on it
        finally:
            close = getattr(leases, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.ttl)
        with self._lock:
            for name in list(self._held):
                with contextlib.suppress(Exception):  # unreachable: it expires by itself
                    self._leases.release(name, self.holder)
            self._held.clear()
        close = getattr(self._leases, "close", None)
        if close is not None:
            close()
