"""The embedded ledger's event log: append, read, scan (the `Recorder` of ledger/store/base.py)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from ledger.errors import ConflictError, StoreError, UsageError
from ledger.events import GENESIS_HASH, Event, NewEvent, dumps, now, sealed_hash
from ledger.store.base import (
    AppendOne,
    AppendResult,
    chained_rows,
    check_stream,
    check_type,
    event_from_row,
)
from ledger.store.sqlite.database import SQLiteDatabase, connect

_NO_LIMIT = 2**62


# Batched appends hand rows to a writer thread in chunks of this many: SQLite steps the
# inserts (B-trees, the trigger, the WAL) with the GIL released while this thread encodes
# and hashes the next chunk, so the two halves of an append run on two cores.
_CHUNK = 2048


class _Retry(Exception):
    """The optimistic attempt of an append was refused: redo it with every lookup."""


class SQLiteRecorder(AppendOne, SQLiteDatabase):
    _read_db: sqlite3.Connection | None = None
    _writer: ThreadPoolExecutor | None = None
    # What this connection knows of the log after its last commit: the head and stream
    # versions, valid while `PRAGMA data_version` (bumped by other connections' commits
    # only) still reads `_seen`. An append then needs no SELECT before its INSERT.
    _seen: int | None = None
    _head: tuple[int, str] = (0, GENESIS_HASH)
    _versions: dict[str, int]

    # -- writing --------------------------------------------------------------------------
    def append_many(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]]
    ) -> list[AppendResult]:
        """Optimistic first: head and versions from this connection's cache, no lookup of
        stored ids (the insert trigger refuses a stored id, a stale head or version, so a
        wrong guess cannot be written). When the database refuses, the whole append is
        redone with every lookup, which tells a retried batch (its original positions) or a
        conflict (ConflictError) from a real error."""
        stamp = now()  # one instant per transaction: the batch is one decision
        try:
            return self._append(batches, stamp, optimistic=True)
        except _Retry:
            return self._append(batches, stamp, optimistic=False)

    def _append(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]], stamp: str, optimistic: bool
    ) -> list[AppendResult]:
        db = self._db
        optimistic_write = False
        try:
            with self._tx():
                seen = db.execute("PRAGMA data_version").fetchone()[0]
                if seen != self._seen or not optimistic:
                    self._seen = None
                    row = db.execute(self._q["head_row"]).fetchone()
                    self._head = row if row else (0, GENESIS_HASH)
                    self._versions = {}
                plan, results = self._plan(batches, optimistic)
                optimistic_write = bool(plan)
                head = self._insert(plan, stamp) if plan else self._head
        except sqlite3.IntegrityError:
            self._seen = None
            if optimistic and optimistic_write:
                raise _Retry from None
            raise
        except ConflictError:
            self._seen = None
            if optimistic:
                raise _Retry from None
            raise
        except BaseException:
            self._seen = None
            raise
        # Committed: what this connection now knows is the truth until someone else writes.
        self._head = head
        for stream, events, _, version in plan:
            self._versions[stream] = version + len(events)
        if len(self._versions) > 65_536:
            self._versions = {}
        self._seen = seen
        return [r if isinstance(r, AppendResult) else AppendResult(*r, False) for r in results]

    def _plan(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]], optimistic: bool
    ) -> tuple[list[tuple[str, Sequence[NewEvent], list[str], int]], list]:
        """Per stream, before anything is written: ids, retries, expected versions."""
        plan: list[tuple[str, Sequence[NewEvent], list[str], int]] = []
        results: list = []
        pending: dict[str, int] = {}
        seq = self._head[0]
        for stream, events, expected in batches:
            check_stream(stream)
            ids = [e.resolve_id(stream) for e in events]
            if not optimistic:
                # Only keyed events can be retries; random ids are new by construction
                # (and the id index would still refuse a collision).
                keyed = [i for i, e in zip(ids, events, strict=True) if e.key is not None]
                stored = self._stored_positions(keyed) if keyed else {}
                if stored and len(stored) == len(ids):
                    results.append(AppendResult(tuple(stored[i] for i in ids), self._version(stream, pending), True))
                    continue
                if stored:  # a retry must repeat the same batch, every event keyed
                    raise UsageError(
                        f"{len(stored)} of the {len(ids)} events appended to {stream!r} are stored already "
                        f"(from seq {min(stored.values())}) but the others are not",
                        hint="a retried batch must be the same batch, with an idempotency key on every event",
                    )
            if len(set(ids)) != len(ids):
                raise UsageError(f"a batch for stream {stream!r} repeats an idempotency key")
            version = self._version(stream, pending)
            if expected is not None and expected != version:
                raise ConflictError(stream, expected, version)
            for new in events:
                check_type(new.type)
            plan.append((stream, events, ids, version))
            pending[stream] = version + len(events)
            results.append((tuple(range(seq + 1, seq + len(events) + 1)), version + len(events)))
            seq += len(events)
        return plan, results
    def import_events(self, events: Sequence[Event]) -> None:
        """Store sealed envelopes as they are, after checking each continues the chain."""
        self._seen = None  # the head moves without the append path knowing it
        try:
            with self._tx() as db:
                head = db.execute(self._q["head_row"]).fetchone()
                db.executemany(self._q["insert"], chained_rows(events, *(head or (0, GENESIS_HASH))))
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"import refused by the ledger: {exc}") from exc

    def _insert(self, plan: list[tuple[str, Sequence[NewEvent], list[str], int]], stamp: str) -> tuple[int, str]:
        """Seal and insert the planned events; the new head (seq, hash)."""
        db, insert = self._db, self._q["insert"]
        seq, prev_hash = self._head
        rows: list[tuple] = []
        flushing: Future | None = None
        # Writers pass the same actor dict for many events: encode each object once.
        actors: dict[int, tuple[object, str]] = {}
        try:
            for stream, events, ids, version in plan:
                for new, id_ in zip(events, ids, strict=True):
                    seq += 1
                    version += 1
                    time_ = new.time or stamp
                    cached = actors.get(id(new.actor))
                    if cached is None or cached[0] is not new.actor:
                        cached = actors[id(new.actor)] = (new.actor, dumps(new.actor))
                    actor_json = cached[1]
                    data_json = dumps(new.data)
                    hash_ = sealed_hash(seq, stream, version, new.type, time_, actor_json, id_, new.causation, data_json, prev_hash)
                    rows.append((seq, stream, version, new.type, time_, actor_json, id_, new.causation, data_json, prev_hash, hash_))
                    prev_hash = hash_
                    if len(rows) >= _CHUNK:
                        if flushing is not None:
                            flushing.result()
                        flushing = self._writer_thread().submit(db.executemany, insert, rows)
                        rows = []
            if flushing is not None:
                flushing.result()
            if rows:
                db.executemany(insert, rows)
        except BaseException:
            if flushing is not None:  # let the writer finish before the rollback
                wait([flushing])
            raise
        return seq, prev_hash

    def _writer_thread(self) -> ThreadPoolExecutor:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="ledger-sqlite-insert")
        return self._writer

    def _stored_positions(self, ids: list[str]) -> dict[str, int]:
        return dict(self._db.execute(self._q["stored_ids"], (json.dumps(ids),)).fetchall())

    def _version(self, stream: str, pending: dict[str, int]) -> int:
        if stream in pending:
            return pending[stream]
        known = self._versions.get(stream)
        if known is not None:
            return known
        row = self._db.execute(self._q["stream_version"], (stream,)).fetchone()
        return row[0] or 0

    # -- reading --------------------------------------------------------------------------
    def head(self) -> int:
        row = self._db.execute(self._q["head"]).fetchone()
        return row[0] or 0

    def read_all(self, after: int = 0, limit: int | None = None) -> Iterator[Event]:
        cur = self._db.execute(self._q["read_all"], (after, -1 if limit is None else limit))
        while rows := cur.fetchmany(4096):
            yield from map(event_from_row, rows)

    def read_stream(self, stream: str, after_version: int = 0) -> list[Event]:
        return [event_from_row(r) for r in self._db.execute(self._q["read_stream"], (stream, after_version))]

    def get_event(self, event_id: str) -> Event | None:
        row = self._db.execute(self._q["get_event"], (event_id,)).fetchone()
        return event_from_row(row) if row else None

    def hash_at(self, seq: int) -> str | None:
        row = self._db.execute(self._q["hash_at"], (seq,)).fetchone()
        return row[0] if row else None

    def stream_version(self, stream: str) -> int:
        row = self._db.execute(self._q["stream_version"], (stream,)).fetchone()
        return row[0] or 0

    def streams(self) -> list[str]:
        return [r[0] for r in self._db.execute(self._q["streams"])]

    def position_at_time(self, iso_time: str) -> int:
        row = self._db.execute(self._q["at_time"], (iso_time,)).fetchone()
        return row[0] or 0

    def count_since(self, after: int) -> int:
        return self._db.execute(self._q["count_since"], (after,)).fetchone()[0]

    def raw_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        return self._scan("raw_rows", after, until)

    def fold_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        return self._scan("fold_rows", after, until)

    def _scan(self, query: str, after: int, until: int | None) -> Iterator[tuple]:
        # A separate read connection: a long scan must not hold this one's transaction state,
        # and WAL gives it a stable view of the ledger at its start.
        # The cursor itself is the iterator: rows are stepped in C, with no generator layer
        # (which cost a third of the row fetch of a full replay). Exhausted, it resets its
        # statement; dropped early, it is finalized when released.
        if self._read_db is None:
            self._read_db = connect(self.path, cache_kib=8192)  # scans are sequential
        return self._read_db.execute(self._q[query], (after, _NO_LIMIT if until is None else until))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.shutdown()
            self._writer = None
        if self._read_db is not None:
            self._read_db.close()
            self._read_db = None
        super().close()
