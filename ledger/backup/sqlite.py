"""The embedded ledger copied page by page with SQLite's online backup API.

The copy runs as one step: one read transaction over the whole file, so it is the ledger as
it stood at one moment, while the watcher and reconciler keep appending (in WAL mode a
reader never blocks a writer, and a writer never changes what an open read sees). The copy
is left in rollback-journal mode: one self-contained file, with no -wal beside it to lose.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from ledger.errors import StoreError


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)


def copy(source: Path, dest: Path) -> None:
    """A consistent copy of the ledger file `source` at `dest` (which must not exist)."""
    try:
        src = _read_only(source)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {source} to back it up: {exc}") from exc
    try:
        with contextlib.closing(sqlite3.connect(dest)) as dst:
            src.backup(dst)  # pages=-1: every page in one step, one snapshot
    except sqlite3.Error as exc:
        raise StoreError(f"backing up {source} failed: {exc}",
                         hint="is there room at the destination, and is the ledger readable?") from exc
    finally:
        src.close()


def settle(path: Path) -> None:
    """Leave the copy as one self-contained file (rollback-journal mode, no -wal beside it)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode = DELETE")


def load(copy_path: Path, target: Path) -> None:
    """Load a verified copy into the ledger file `target`, which holds no events (SQLite's
    backup API into it: a process that has it open sees the whole new content or none)."""
    try:
        with contextlib.closing(_read_only(copy_path)) as src, contextlib.closing(sqlite3.connect(target)) as dst:
            src.backup(dst)
    except sqlite3.Error as exc:
        raise StoreError(f"loading the backup into {target} failed: {exc}") from exc
