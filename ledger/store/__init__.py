"""Open a ledger store by URL: sqlite:///path (embedded default) or postgresql://..."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator

from ledger import defaults
from ledger.errors import StoreError, UsageError
from ledger.store.base import AppendResult, Snapshot, Store

DEFAULT_STORE_PATH = defaults.STORE_PATH


def default_store_url() -> str:
    return os.environ.get("LEDGER_STORE") or f"sqlite:///{DEFAULT_STORE_PATH}"


def open_store(url: str | None = None, *, create: bool = True) -> Store:
    url = url or default_store_url()
    if url.startswith("sqlite:///"):
        from ledger.store.sqlite import SQLiteStore

        # sqlite:///path?synchronous=NORMAL trades power-loss durability for speed (see sqlite.py)
        path, _, query = url.removeprefix("sqlite:///").partition("?")
        options = dict(part.partition("=")[::2] for part in query.split("&") if part)
        unknown = set(options) - {"synchronous"}
        if unknown:
            raise UsageError(f"unknown SQLite store option(s) {sorted(unknown)} in {url!r}", hint="only ?synchronous=FULL|NORMAL")
        return SQLiteStore(path, create=create, synchronous=options.get("synchronous", "FULL").upper())
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from ledger.store.postgres import PostgresStore
        except ImportError as exc:  # pragma: no cover - until the PostgreSQL backend lands
            raise UsageError(f"PostgreSQL store unavailable: {exc}") from exc
        return PostgresStore(url, create=create)
    raise UsageError(
        f"unknown store URL {url!r}",
        hint="use sqlite:///path/to/ledger.db or postgresql://user@host/db (--store or LEDGER_STORE)",
    )


@contextlib.contextmanager
def store_errors(url: str | None = None) -> Iterator[None]:
    """Turn a database failure in the middle of a read or write into a one-line StoreError."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        where = url or default_store_url()
        raise StoreError(f"ledger {where} failed: {exc}", hint="is the file intact and readable? try `ledger verify`") from exc
    except Exception as exc:  # psycopg errors, without importing psycopg here
        if type(exc).__module__.startswith("psycopg"):
            raise StoreError(f"ledger {url or default_store_url()} failed: {exc}".strip()) from exc
        raise


__all__ = ["store_errors", "AppendResult", "Snapshot", "Store", "open_store", "default_store_url", "DEFAULT_STORE_PATH"]
