"""The shared PostgreSQL backend: its recorder, snapshots and cursors, leases, and SQL files.

`open_store(url)` / `open_leases(url)` / `open_heartbeats(url)` take `postgresql://user@host:port/db[?schema=name]`.
Importing this package imports psycopg: `ledger.store` does so only when such a URL is opened.
"""

from __future__ import annotations

from ledger.store.postgres.database import READER_ROLE, WRITER_ROLE, PgDatabase, split_url
from ledger.store.postgres.heartbeats import PostgresHeartbeats
from ledger.store.postgres.leases import PostgresLeases
from ledger.store.postgres.store import PostgresStore

PREFIXES = ("postgresql://", "postgres://")


def open_store(url: str, *, create: bool = True) -> PostgresStore:
    return PostgresStore(url, create=create)


def upgrade(url: str, *, dry_run: bool = False, force: bool = False) -> tuple[int, int]:
    """`ledger upgrade`: the ledger schema at `url` brought to this code's format, (from, to)."""
    db = PgDatabase(url, create=False, upgrade=True)
    try:
        return db.upgrade_format(dry_run=dry_run, force=force)
    finally:
        db.close()


def open_leases(url: str) -> PostgresLeases:
    """Leases of the ledger at `url` (created if missing), on a connection of their own."""
    return PostgresLeases(PgDatabase(url), owns_db=True)


def open_heartbeats(url: str, *, create: bool = True) -> PostgresHeartbeats:
    """Heartbeats of the ledger at `url` (the ledger must exist unless `create`), on a connection of their own."""
    return PostgresHeartbeats(PgDatabase(url, create=create), owns_db=True)


__all__ = ["PREFIXES", "READER_ROLE", "WRITER_ROLE", "PostgresHeartbeats", "PostgresLeases", "open_heartbeats", "PostgresStore", "open_leases", "open_store", "split_url", "upgrade"]
