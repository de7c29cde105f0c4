"""The store contract every backend honours (SQLite embedded, PostgreSQL shared).

- `append` is atomic: all of a batch or none of it.
- `expected_version` (None = any) guards a stream against concurrent writers.
- An event whose id is already stored is not stored again: the original positions return.
- Rows are never updated or deleted; the database itself refuses it.
- `seq` is global and gap-free, `version` is per stream and gap-free, and every event's
  `prev_hash` is the `hash` of the event at `seq - 1`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ledger.errors import UsageError
from ledger.events import EVENT_TYPES, Event, NewEvent

# Bumped when the on-disk layout changes; a store written by newer code is refused.
# 2: actor/data stored as canonical JSON text (the hashed bytes are rebuilt from the
#    columns without decoding) and an insert trigger that only lets the chain grow at its head.
FORMAT_VERSION = 2

_KNOWN_TYPES = frozenset(EVENT_TYPES)


def check_stream(stream: str) -> None:
    """Stream names are job ids (`owner/name`) or system streams (`_name`)."""
    if not isinstance(stream, str) or not stream or len(stream) > 300 or not stream.isprintable():
        raise UsageError(f"bad stream name {stream!r}", hint="a job id owner/name, or _system-stream")


def check_type(type_: str) -> None:
    if type_ not in _KNOWN_TYPES:
        raise UsageError(f"unknown event type {type_!r}", hint="event types are the data classes in ledger/events/data.py")


@dataclass(frozen=True, slots=True)
class AppendResult:
    positions: tuple[int, ...]  # seq of each event of the batch, in order
    version: int  # the stream's version after the append
    duplicate: bool  # True when every event was already stored (a retried append)


@dataclass(frozen=True, slots=True)
class Snapshot:
    name: str
    code_version: str
    position: int
    state: bytes


class Store(Protocol):
    url: str

    def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int | None = None
    ) -> AppendResult: ...

    def append_many(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]]
    ) -> list[AppendResult]:
        """Several streams' batches in one transaction (bulk ingest, import, benchmarks)."""
        ...

    def import_events(self, events: Sequence[Event]) -> None:
        """Store already-sealed envelopes as they are (import, migrate); chain is checked."""
        ...

    def read_all(self, after: int = 0, limit: int | None = None) -> Iterator[Event]: ...

    def raw_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        """Rows in seq order as stored, without decoding: (seq, stream, version, type, time,
        actor_json, id, causation, data_json, prev_hash, hash), actor/data as the canonical
        JSON text (`ledger.events.dumps`). `events.body_text(*row[:10])` gives the hashed bytes.
        Verify and export read this."""
        ...

    def fold_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        """(seq, stream, version, type, time, data_json) in seq order, seq in (after, until]:
        all the fold needs. Replay reads this."""
        ...

    def count_since(self, after: int) -> int:
        """How many events have seq > after (progress bars)."""
        ...

    def read_stream(self, stream: str, after_version: int = 0) -> list[Event]: ...

    def get_event(self, event_id: str) -> Event | None: ...

    def head(self) -> int: ...

    def stream_version(self, stream: str) -> int: ...

    def streams(self) -> list[str]: ...

    def position_at_time(self, iso_time: str) -> int:
        """The last seq whose event time is <= iso_time (0 if none)."""
        ...

    def save_snapshot(self, snapshot: Snapshot) -> None: ...

    def load_snapshot(self, name: str, code_version: str, at_most: int | None = None) -> Snapshot | None: ...

    def get_cursor(self, name: str) -> int: ...

    def set_cursor(self, name: str, position: int) -> None:
        """Cursors (fan-out, notifier) live beside the events; they only move forward."""
        ...

    def wait_for_append(self, after: int, timeout: float) -> int:
        """Block until head() > after or timeout; returns head(). Backends may poll."""
        ...

    def close(self) -> None: ...


def check_format(found: str | int, where: str) -> None:
    """Refuse a ledger written in another on-disk format, saying what to do about it."""
    from ledger.errors import StoreError

    if int(found) > FORMAT_VERSION:
        raise StoreError(
            f"ledger {where} has format {found}, newer than this tpu-ledger ({FORMAT_VERSION})",
            hint="upgrade tpu-ledger to read it",
        )
    if int(found) < FORMAT_VERSION:
        raise StoreError(
            f"ledger {where} has format {found}, older than this tpu-ledger ({FORMAT_VERSION})",
            hint="export it with the older tpu-ledger and `ledger import` the file into a new store",
        )
