"""Open a ledger store by URL: sqlite:///path (embedded default) or postgresql://..."""

from __future__ import annotations

import os
from pathlib import Path

from ledger.errors import UsageError
from ledger.store.base import AppendResult, Snapshot, Store

DEFAULT_STORE_PATH = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share")) / "tpu-ledger/ledger.db"


def default_store_url() -> str:
    return os.environ.get("LEDGER_STORE") or f"sqlite:///{DEFAULT_STORE_PATH}"


def open_store(url: str | None = None, *, create: bool = True) -> Store:
    url = url or default_store_url()
    if url.startswith("sqlite:///"):
        from ledger.store.sqlite import SQLiteStore

        return SQLiteStore(url.removeprefix("sqlite:///"), create=create)
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


__all__ = ["AppendResult", "Snapshot", "Store", "open_store", "default_store_url", "DEFAULT_STORE_PATH"]
