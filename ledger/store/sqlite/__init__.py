"""The embedded SQLite backend: its recorder, snapshots and cursors, leases, and SQL files.

`open_store(url)` / `open_leases(url)` / `open_heartbeats(url)` take `sqlite:///path[?synchronous=FULL|NORMAL]`;
`ledger.store` dispatches URLs here.
"""

from __future__ import annotations

from pathlib import Path

from ledger.errors import UsageError
from ledger.store.sqlite.database import SQLiteDatabase
from ledger.store.sqlite.heartbeats import SQLiteHeartbeats
from ledger.store.sqlite.leases import SQLiteLeases
from ledger.store.sqlite.store import SQLiteStore

PREFIX = "sqlite:///"


def _parse(url: str) -> tuple[str, dict[str, str]]:
    # sqlite:///path?synchronous=NORMAL trades power-loss durability for speed (database.py)
    path, _, query = url.removeprefix(PREFIX).partition("?")
    options = dict(part.partition("=")[::2] for part in query.split("&") if part)
    unknown = set(options) - {"synchronous"}
    if unknown:
        raise UsageError(f"unknown SQLite store option(s) {sorted(unknown)} in {url!r}", hint="only ?synchronous=FULL|NORMAL")
    return path, options


def path_of(url: str) -> Path:
    """The ledger file an sqlite:/// URL names."""
    return Path(_parse(url)[0])


def open_store(url: str, *, create: bool = True) -> SQLiteStore:
    path, options = _parse(url)
    return SQLiteStore(path, create=create, synchronous=options.get("synchronous", "FULL").upper())


def upgrade(url: str, *, dry_run: bool = False, force: bool = False) -> tuple[int, int]:
    """`ledger upgrade`: the ledger file at `url` brought to this code's format, (from, to)."""
    db = SQLiteDatabase(_parse(url)[0], create=False, upgrade=True)
    try:
        return db.upgrade_format(dry_run=dry_run, force=force)
    finally:
        db.close()


def open_leases(url: str) -> SQLiteLeases:
    """Leases of the ledger at `url` (created if missing), on a connection of their own."""
    with open_store(url) as store:
        return store.leases()


def open_heartbeats(url: str, *, create: bool = True) -> SQLiteHeartbeats:
    """Heartbeats of the ledger at `url` (the ledger must exist unless `create`), on a connection of their own."""
    with open_store(url, create=create) as store:
        return SQLiteHeartbeats(store.path)


__all__ = ["PREFIX", "SQLiteHeartbeats", "SQLiteLeases", "open_heartbeats", "SQLiteStore", "open_leases", "open_store", "path_of", "upgrade"]
