"""Errors a user can act on. The CLI prints them as one line and exits with their code."""

from __future__ import annotations


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
