"""Open a ledger store by URL: sqlite:///path (embedded default) or postgresql://...

The one place a URL picks a backend. The interfaces are in `ledger.store.base` (Reader,
Recorder, Snapshots, Cursors, AppendWaiter, Store) and `ledger.store.leases` (Leases,
LeaseKeeper); each backend package (`sqlite`, `postgres`) holds its parts and SQL files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType

from ledger import defaults
from ledger.errors import UsageError, database_error
from ledger.store import sqlite
from ledger.store.base import (
    AppendResult,
    AppendWaiter,
    Cursors,
    Reader,
    Recorder,
    Snapshot,
    SnapshotReader,
    Snapshots,
    Store,
)
from ledger.store.leases import Leases

DEFAULT_STORE_PATH = defaults.STORE_PATH
default_store_url = defaults.store_url


def _backend(url: str) -> ModuleType:
    if url.startswith(sqlite.PREFIX):
        return sqlite
    if url.startswith(("postgresql://", "postgres://")):
        # Imported here, on the first PostgreSQL URL, and not at the top: the backend imports
        # psycopg, which an SQLite user (and `ledger --help`) should never pay for.
        from ledger.store import postgres

        return postgres
    raise UsageError(
        f"unknown store URL {url!r}",
        hint="use sqlite:///path/to/ledger.db or postgresql://user@host/db (--store or LEDGER_STORE)",
    )


def open_store(url: str | None = None, *, create: bool = True) -> Store:
    url = url or default_store_url()
    return _backend(url).open_store(url, create=create)


def open_leases(url: str | None = None) -> Leases:
    """Leases of the ledger at `url` on a connection of their own; `close()` when done."""
    url = url or default_store_url()
    return _backend(url).open_leases(url)


@contextlib.contextmanager
def store_errors(url: str | None = None) -> Iterator[None]:
    """Turn a database failure in the middle of a read or write into a one-line StoreError."""
    try:
        yield
    except Exception as exc:
        error = database_error(exc, url or default_store_url())
        if error is None:
            raise
        raise error from exc


__all__ = [
    "DEFAULT_STORE_PATH", "AppendResult", "AppendWaiter", "Cursors", "Leases", "Reader", "Recorder",
    "Snapshot", "SnapshotReader", "Snapshots", "Store", "default_store_url",
    "open_leases", "open_store", "store_errors",
]
