"""Errors a user can act on. The CLI prints them as one line and exits with their code."""

from __future__ import annotations

import sys
from urllib.parse import urlsplit, urlunsplit


class LedgerError(Exception):
    """A failure the user can fix; `exit_code` 1 = failed check or runtime, 2 = bad usage."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} ({self.hint})" if self.hint else base


class UsageError(LedgerError):
    exit_code = 2


class ConflictError(LedgerError):
    """The stream moved on since the caller read it: re-read and decide again."""

    def __init__(self, stream: str, expected: int, actual: int) -> None:
        super().__init__(
            f"version conflict on stream {stream!r}: expected version {expected}, found {actual}",
            hint="another writer appended first; re-read the stream and retry",
        )
        self.stream = stream
        self.expected = expected
        self.actual = actual


class StoreError(LedgerError):
    pass


class IntegrityError(LedgerError):
    """The ledger's chain or invariants are broken at `position`."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"ledger unsound at seq {position}: {reason}")
        self.position = position
        self.reason = reason


def safe_url(url: str) -> str:
    """A store URL without its password, for messages."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    if len(netloc) == 2 and ":" in netloc[0]:  # never print a password
        return urlunsplit(parts._replace(netloc=netloc[0].split(":")[0] + ":***@" + netloc[1]))
    return url


def database_error(exc: BaseException, url: str) -> StoreError | None:
    """A database failure (a damaged SQLite file, a lost PostgreSQL connection, a dropped
    table) as a one-line StoreError about the ledger at `url`; None for anything else.

    The drivers are looked up, never imported: an error can only be a driver's if that
    driver is loaded, and the CLI asks this for every failure, `ledger --help` included.
    sqlite3's ProgrammingError (an API misuse: a bug, which deserves its traceback) is not one."""
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.ProgrammingError):
        return StoreError(
            f"ledger {safe_url(url)} cannot be read or written: {exc}",
            hint="if the file is damaged, restore it from a backup, or export what a copy of it still reads",
        )
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(exc, psycopg.Error):
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return StoreError(f"ledger {safe_url(url)} failed: {first}")
    return None
