"""Open a ledger store by URL: sqlite:///path (embedded default) or postgresql://...

SQLite URLs follow SQLAlchemy's rule: `sqlite:///` then the path, so four slashes make an
absolute path (`sqlite:////var/lib/tpu-ledger/ledger.db`) and three a relative one
(`sqlite:///ledger.db`, from the working directory); `~` is expanded (`sqlite:///~/ledger.db`).
A relative path is resolved once, here, so every message and log line names the absolute
file. It opens an existing ledger, but never creates one, unless it says it means the working
directory (`sqlite:///./ledger.db`): two commands started in different directories would
otherwise write two ledgers without a word.

The one place a URL picks a backend. The interfaces are in `ledger.store.base` (Reader,
Recorder, Snapshots, Cursors, AppendWaiter, Store) and `ledger.store.leases` (Leases,
LeaseKeeper), `ledger.store.heartbeats` (Heartbeats); each backend package (`sqlite`, `postgres`) holds its parts and SQL files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
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
from ledger.store.heartbeats import Heartbeats
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


def resolve_url(url: str, *, create: bool = False) -> str:
    """`url` with an SQLite path made absolute (see the rule above); other URLs as given.
    Refuses to create a ledger from a path that is relative by accident."""
    if not url.startswith(sqlite.PREFIX):
        return url
    path, sep, query = url.removeprefix(sqlite.PREFIX).partition("?")
    given = Path(path).expanduser()
    if given.is_absolute():
        return f"{sqlite.PREFIX}{given}{sep}{query}"
    absolute = Path.cwd() / given
    if create and not absolute.exists() and not path.startswith("./"):
        raise UsageError(
            f"{url} is a relative path (it would create {absolute}, in the working directory)",
            hint=f"for /{path} write sqlite:////{path} (four slashes: an absolute path); "
                 f"for the working directory write sqlite:///./{path}",
        )
    return f"{sqlite.PREFIX}{absolute.resolve()}{sep}{query}"


def open_store(url: str | None = None, *, create: bool = True) -> Store:
    url = resolve_url(url or default_store_url(), create=create)
    return _backend(url).open_store(url, create=create)


def upgrade_store(url: str | None = None, *, dry_run: bool = False, force: bool = False) -> tuple[int, int]:
    """`ledger upgrade`: bring the ledger at `url` to this code's format in one transaction;
    (from, to) formats, equal when it was current. Refused while a lease is held (a
    reconciler still running), unless `force`. Every other way of opening a ledger refuses
    an older format (docs/upgrades.md)."""
    url = resolve_url(url or default_store_url())
    return _backend(url).upgrade(url, dry_run=dry_run, force=force)


def open_leases(url: str | None = None) -> Leases:
    """Leases of the ledger at `url` on a connection of their own; `close()` when done."""
    url = resolve_url(url or default_store_url(), create=True)
    return _backend(url).open_leases(url)


def open_heartbeats(url: str | None = None, *, create: bool = True) -> Heartbeats:
    """Heartbeats of the ledger at `url` on a connection of their own (`ledger.store.heartbeats`);
    `create=False` for readers (`ledger status`): the ledger must exist. `close()` when done."""
    url = resolve_url(url or default_store_url(), create=create)
    return _backend(url).open_heartbeats(url, create=create)


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
    "DEFAULT_STORE_PATH", "AppendResult", "AppendWaiter", "Cursors", "Heartbeats", "Leases", "Reader", "Recorder",
    "Snapshot", "SnapshotReader", "Snapshots", "Store", "default_store_url",
    "open_heartbeats", "open_leases", "open_store", "resolve_url", "store_errors", "upgrade_store",
]
