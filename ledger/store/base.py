"""What every backend (SQLite embedded, PostgreSQL shared) offers, split by concern.

The split follows the `eventsourcing` library's recorders: a small interface per job, so a
consumer names only what it uses and a backend is checked piece by piece.

- `Reader`: the event log read side (head, events by position or stream, row scans for
  replay, verify and export, the hash at one position for snapshot checks).
- `Recorder`: a Reader that appends (eventsourcing's AggregateRecorder + ApplicationRecorder).
- `Snapshots`: saved folds of the log, a cache that is checked, never trusted (ledger.replay).
- `Cursors`: named positions that only move forward (eventsourcing's TrackingRecorder).
- `AppendWaiter`: sleep until the log grows (eventsourcing's Subscription).
- `Store`: all of them on one ledger, what `open_store` returns.
- Leases live in `ledger.store.leases` (each backend has its own table and SQL).

The contract of the log:
- `append` is atomic: all of a batch or none of it.
- `expected_version` (None = any) guards a stream against concurrent writers.
- An event whose id is already stored is not stored again: the original positions return.
- Rows are never updated or deleted; the database itself refuses it, whoever writes.
- `seq` is global and gap-free, `version` is per stream and gap-free, and every event's
  `prev_hash` is the `hash` of the event at `seq - 1`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ledger.errors import StoreError, UsageError
from ledger.events import EVENT_TYPES, Event, NewEvent, body_text, dumps, row_hash

# Bumped when the on-disk layout changes (docs/upgrades.md lists every format). A store is
# opened only at this exact format: newer code never upgrades a store behind the back of older
# processes still running on it (a rolling upgrade across hosts); `ledger upgrade` does it,
# explicitly, once they are stopped.
# 2: actor/data stored as canonical JSON text (the hashed bytes are rebuilt from the
#    columns without decoding) and an insert trigger that only lets the chain grow at its head.
# 3: snapshots carry the hash of the event they fold up to and their own hash; SQLite's
#    insert trigger refuses a stored id (INSERT OR REPLACE would delete that row silently).
# 4: an older format is no longer upgraded by whoever opens it: only `ledger upgrade` does.
#    SQLite's insert trigger reads the head row once (seq and hash), not twice. PostgreSQL's
#    schema is unchanged.
# 5: PostgreSQL: append_one (one event, scalar arguments), the growth trigger probes each new
#    row's neighbours instead of sorting the batch, and the append functions NOTIFY
#    themselves (no trigger on head).
FORMAT_VERSION = 5
# Older formats `ledger upgrade` brings to FORMAT_VERSION in place (the upgrade only replaces
# triggers, indexes and the snapshot cache, never an event).
UPGRADABLE_FROM = frozenset({2, 3, 4})
UPGRADE_COMMAND = "ledger upgrade"

_KNOWN_TYPES = frozenset(EVENT_TYPES)

# The column order of `Reader.raw_rows` and of every backend's events table.
COLUMNS = ("seq", "stream", "version", "type", "time", "actor", "id", "causation", "data", "prev_hash", "hash")


def check_stream(stream: str) -> None:
    """Stream names are job ids (`owner/name`) or system streams (`_name`)."""
    if not isinstance(stream, str) or not stream or len(stream) > 300 or not stream.isprintable():
        raise UsageError(f"bad stream name {stream!r}", hint="a job id owner/name, or _system-stream")


def check_type(type_: str) -> None:
    if type_ not in _KNOWN_TYPES:
        raise UsageError(f"unknown event type {type_!r}", hint="event types are the data classes in ledger/events/data.py")


def event_from_row(row: tuple) -> Event:
    """An Event from a row in COLUMNS order (actor and data as stored JSON text)."""
    seq, stream, version, type_, time_, actor, id_, causation, data, prev_hash, hash_ = row
    return Event(seq, stream, version, type_, time_, json.loads(actor), id_, causation, json.loads(data), prev_hash, hash_,
                 actor, data)


class ActorTexts:
    """The canonical text of each actor of one append. Writers pass one actor dict for many
    events, so each object is encoded once (kept by identity, with the object itself held
    so a freed id cannot be reused by another dict during the append)."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[object, str]] = {}

    def __call__(self, actor: dict) -> str:
        cached = self._texts.get(id(actor))
        if cached is None or cached[0] is not actor:
            cached = self._texts[id(actor)] = (actor, dumps(actor))
        return cached[1]


def chained_rows(events: Sequence[Event], head: int, head_hash: str) -> list[tuple]:
    """The rows of sealed envelopes (import, migrate) after checking that each continues the
    chain from (head, head_hash) and hashes as it claims; StoreError naming the first that
    does not."""
    rows = []
    seq, prev_hash = head, head_hash
    for ev in events:
        row = ev.row()
        if ev.seq != seq + 1 or ev.prev_hash != prev_hash or row_hash(ev.prev_hash, body_text(*row[:10])) != ev.hash:
            raise StoreError(f"event seq {ev.seq} does not continue the chain at seq {seq}")
        seq, prev_hash = ev.seq, ev.hash
        rows.append(row)
    return rows


def check_format(found: str | int, where: str, *, upgrade: bool = False) -> bool:
    """Refuse a ledger written in another on-disk format, in one line naming both formats and
    what to do. True when it is an older format and `upgrade` (only `ledger upgrade` passes
    it) asks to bring it to this one."""
    found = int(found)
    if found > FORMAT_VERSION:
        raise StoreError(
            f"ledger {where} has format {found}, newer than this tpu-ledger's format {FORMAT_VERSION}: "
            "install the tpu-ledger that upgraded it on this host too (docs/upgrades.md)"
        )
    if found == FORMAT_VERSION:
        return False
    if found not in UPGRADABLE_FROM:
        raise StoreError(
            f"ledger {where} has format {found}, older than this tpu-ledger's format {FORMAT_VERSION} "
            "can upgrade",
            hint="export it with the older tpu-ledger and `ledger import` the file into a new store",
        )
    if not upgrade:
        raise StoreError(
            f"ledger {where} has format {found}, older than this tpu-ledger's format {FORMAT_VERSION}: "
            f"once no older tpu-ledger runs on it, back it up and run `{UPGRADE_COMMAND}` (docs/upgrades.md)"
        )
    return True


def check_no_holders(holders: Sequence[str], where: str) -> None:
    """`ledger upgrade` refuses while anyone holds a lease on the ledger: a reconciler of the
    older version still running would go on writing under a format it does not know."""
    if holders:
        shown = ", ".join(holders[:5]) + (f" and {len(holders) - 5} more" if len(holders) > 5 else "")
        raise StoreError(
            f"ledger {where} is in use: {shown} still hold{'s' if len(holders) == 1 else ''} a lease; "
            "stop every older tpu-ledger process first (or wait for the leases to lapse, or --force)"
        )


@dataclass(frozen=True, slots=True)
class AppendResult:
    positions: tuple[int, ...]  # seq of each event of the batch, in order
    version: int  # the stream's version after the append
    duplicate: bool  # True when every event was already stored (a retried append)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A saved fold of the ledger up to `position`, tied to the chain and to the fold's code.

    `event_hash` is the hash of the event at `position` (the genesis hash at 0): a snapshot
    whose event is not the one in the chain (a ledger re-imported, a forged row) is not
    used. `hash` covers every other field, `state` included: a snapshot altered after it
    was saved is not used either. `Snapshot.seal` computes it.
    """

    name: str
    code_version: str
    position: int
    event_hash: str
    state: bytes
    hash: str

    @classmethod
    def seal(cls, name: str, code_version: str, position: int, event_hash: str, state: bytes) -> Snapshot:
        return cls(name, code_version, position, event_hash, state,
                   snapshot_hash(name, code_version, position, event_hash, state))

    @property
    def intact(self) -> bool:
        """Its content still hashes to its hash."""
        return self.hash == snapshot_hash(self.name, self.code_version, self.position, self.event_hash, self.state)

    @property
    def label(self) -> str:
        return f"snapshot {self.name!r} at seq {self.position} (code {self.code_version})"


def snapshot_hash(name: str, code_version: str, position: int, event_hash: str, state: bytes) -> str:
    # A canonical JSON header, then the state's bytes: no two snapshots share an encoding.
    digest = hashlib.sha256(dumps([name, code_version, position, event_hash]).encode("utf-8") + b"\n")
    digest.update(state)
    return digest.hexdigest()


class Reader(Protocol):
    """The event log, read side."""

    url: str

    def head(self) -> int: ...

    def read_all(self, after: int = 0, limit: int | None = None) -> Iterator[Event]: ...

    def read_stream(self, stream: str, after_version: int = 0) -> list[Event]: ...

    def get_event(self, event_id: str) -> Event | None: ...

    def stream_version(self, stream: str) -> int: ...

    def streams(self) -> list[str]: ...

    def position_at_time(self, iso_time: str) -> int:
        """The last seq whose event time is <= iso_time (0 if none)."""
        ...

    def hash_at(self, seq: int) -> str | None:
        """The stored hash of the event at `seq` (None past the head); one indexed lookup."""
        ...

    def raw_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        """Rows in seq order as stored, without decoding, in COLUMNS order, actor/data as
        the canonical JSON text (`ledger.events.dumps`); `events.body_text(*row[:10])` gives
        the hashed bytes. Verify and export read this."""
        ...

    def fold_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        """(seq, stream, version, type, time, data_json) in seq order, seq in (after, until]:
        all the fold needs. Replay reads this."""
        ...

    def stream_rows(self, streams: Collection[str], types: Collection[str], until: int) -> list[tuple]:
        """fold_rows' rows of `streams`' events of `types` with seq <= until, in seq order:
        one indexed query for a few streams (`ledger tpus` reads its TPUs' health so)."""
        ...


class Recorder(Reader, Protocol):
    """The event log: the only way events get in."""

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

    def refresh_statistics(self) -> None:
        """After a bulk load (import, migrate): tell the database's planner what the events
        table now holds, so that the first reads after it are planned for its size."""
        ...


class AppendOne:
    """`Recorder.append` for a backend that implements `append_many`: one batch of many."""

    def append_many(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]]
    ) -> list[AppendResult]:
        raise NotImplementedError

    def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int | None = None
    ) -> AppendResult:
        return self.append_many([(stream, events, expected_version)])[0]


class Snapshots(Protocol):
    """Saved folds. The store keeps them; whoever loads one checks it (ledger.replay)."""

    def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store it (replacing one of the same name, code and position) and keep the newest
        few per name."""
        ...

    def load_snapshot(self, name: str, code_version: str, at_most: int | None = None) -> Snapshot | None:
        """The newest of that name and code with position <= at_most."""
        ...

    def list_snapshots(self) -> list[Snapshot]:
        """Every stored snapshot, any name or code, by position (verify checks them all)."""
        ...

    def delete_snapshot(self, snapshot: Snapshot) -> None: ...


class Cursors(Protocol):
    """Named positions beside the events (fan-out, notifier); they only move forward."""

    def get_cursor(self, name: str) -> int: ...

    def set_cursor(self, name: str, position: int) -> None: ...


class AppendWaiter(Protocol):
    def wait_for_append(self, after: int, timeout: float) -> int:
        """Block until head() > after or timeout; returns head(). Backends may poll."""
        ...


class SnapshotReader(Reader, Snapshots, Protocol):
    """What replay needs: the log to fold and the snapshots to start from."""


class Store(Recorder, Snapshots, Cursors, AppendWaiter, Protocol):
    """One ledger, every concern: what `ledger.store.open_store` returns."""

    def close(self) -> None: ...
