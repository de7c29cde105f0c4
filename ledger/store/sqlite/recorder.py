"""The embedded ledger's event log: append, read, scan (the `Recorder` of ledger/store/base.py)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TypeVar

from ledger.errors import ConflictError, StoreError, UsageError
from ledger.events import GENESIS_HASH, Event, NewEvent, dumps, now, sealed_hash
from ledger.store.base import (
    ActorTexts,
    AppendOne,
    AppendResult,
    chained_rows,
    check_stream,
    check_type,
    event_from_row,
)
from ledger.store.sqlite.database import SQLiteDatabase, connect

_NO_LIMIT = 2**62
# Rows per INSERT statement of a batch. Each statement runs in a statement journal (the
# insert trigger may abort it), and SQLite copies every page the statement touches into it:
# one multi-row INSERT copies the table's and indexes' pages once for 100 rows, where
# executemany copied them for every row (bench/ledger_bench.py: about 1.5 us a row of ~17).
_ROWS_PER_INSERT = 100
T = TypeVar("T")


class _Request:
    """One caller's append waiting for the group commit that carries it."""

    __slots__ = ("batches", "done", "error", "result")

    def __init__(self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]]) -> None:
        self.batches = batches
        self.done = False
        self.result: list[AppendResult] = []
        self.error: BaseException | None = None


def _many_rows(insert: str, count: int) -> str:
    """queries.sql's one-row INSERT ... VALUES (?, ...) made to insert `count` rows."""
    head, values, row = insert.split(";")[0].rpartition("VALUES")
    return f"{head}{values} {', '.join([row.strip()] * count)}"


def _one_event(batches: Sequence[tuple[str, Sequence[NewEvent], int | None]]) -> bool:
    return len(batches) == 1 and len(batches[0][1]) == 1


class SQLiteRecorder(AppendOne, SQLiteDatabase):
    _read_db: sqlite3.Connection | None = None
    # What this connection knows of the log: the head and stream versions, kept exact by
    # this connection's own appends and valid while `PRAGMA data_version` (bumped by other
    # connections' commits only) still reads `_seen`. An append then needs no SELECT; a lone
    # event needs no transaction of its own either (`_lone_insert`).
    _seen: int | None = None
    _head: tuple[int, str] = (0, GENESIS_HASH)
    _versions: dict[str, int]
    _per_insert: int

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - SQLiteDatabase's
        super().__init__(*args, **kwargs)
        self._versions = {}
        # As many rows as the library lets one statement bind: SQLite before 3.32 (Ubuntu
        # 20.04's, say) allows 999 values, 90 rows, where 100 failed every batch of 100 or more.
        limit = self._db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self._per_insert = max(1, min(_ROWS_PER_INSERT, limit // self._q["insert"].count("?")))
        self._q["insert_many"] = _many_rows(self._q["insert"], self._per_insert)
        self._queue: list[_Request] = []
        self._queue_lock = threading.Lock()
        self._commit_lock = threading.Lock()

    # -- writing --------------------------------------------------------------------------
    def append_many(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]]
    ) -> list[AppendResult]:
        """Group commit: threads appending through this store at once share one transaction
        and one fsync. Whoever takes the commit lock commits every append queued by then,
        each in its own savepoint (one refused append fails alone); the others find theirs
        done. A lone writer pays one uncontended lock."""
        request = _Request(batches)
        with self._queue_lock:
            self._queue.append(request)
        with self._commit_lock:
            if not request.done:
                with self._queue_lock:
                    group, self._queue = self._queue, []
                self._commit(group)
        if request.error is not None:
            raise request.error
        return request.result

    def _commit(self, group: list[_Request]) -> None:
        stamp = now()  # one instant per transaction: the batch is one decision
        if len(group) == 1:
            # Alone, an append runs without a savepoint (SQLite copies every page a savepoint
            # touches to a sub-journal: a fifth of a batch's cost); a refused optimistic
            # attempt rolls the transaction back and is redone whole, with every lookup.
            request = group[0]
            try:
                try:
                    if self._seen is not None and _one_event(request.batches):
                        request.result = self._lone_insert(request.batches, stamp)
                    else:
                        request.result = self._transaction(lambda: self._attempt(request.batches, stamp, optimistic=True))
                except (sqlite3.IntegrityError, ConflictError):
                    request.result = self._transaction(lambda: self._attempt(request.batches, stamp, optimistic=False))
            except BaseException as exc:
                request.error = exc
            request.done = True
            return

        def each() -> None:
            for request in group:
                try:
                    request.result = self._in_savepoint(request.batches, stamp)
                except Exception as exc:  # this append fails alone; the others commit
                    request.error = exc

        try:
            self._transaction(each)
        except BaseException as exc:
            for request in group:
                request.error = request.error or exc
        for request in group:
            request.done = True

    def _lone_insert(self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]], stamp: str) -> list[AppendResult]:
        """One event, from the cache: its INSERT is the whole transaction (autocommit: the
        write lock, the insert trigger's checks against the file as it is, the commit and
        its fsync), with no BEGIN, no PRAGMA data_version and no COMMIT round trip. A cache
        made stale by another connection's commit cannot be written: that commit moved the
        head, so the trigger refuses this row's seq, and the caller redoes it with every
        lookup (and `_transaction` reloads the cache)."""
        try:
            return self._attempt(batches, stamp, optimistic=True)
        except BaseException:
            self._seen = None
            raise

    def _transaction(self, work: Callable[[], T]) -> T:
        """work() in one write transaction; the cache is checked at its start and is the
        truth after its commit, until another connection writes."""
        db = self._db
        try:
            with self._tx():
                seen = db.execute("PRAGMA data_version").fetchone()[0]
                if seen != self._seen:
                    self._reload()
                result = work()
        except BaseException:
            self._seen = None
            raise
        self._seen = seen
        if len(self._versions) > 65_536:
            self._versions = {}
        return result

    def _reload(self) -> None:
        row = self._db.execute(self._q["head_row"]).fetchone()
        self._head = row if row else (0, GENESIS_HASH)
        self._versions = {}

    def _in_savepoint(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]], stamp: str
    ) -> list[AppendResult]:
        """One append of a group, all of it or none. An attempt's only write is one
        executemany: for one row SQLite's statement rollback already undoes a refusal, so
        only batches need a savepoint."""
        db = self._db
        savepoint = sum(len(events) for _, events, _ in batches) > 1
        if savepoint:
            db.execute("SAVEPOINT append")
        try:
            try:
                result = self._attempt(batches, stamp, optimistic=True)
            except (sqlite3.IntegrityError, ConflictError):
                if savepoint:
                    db.execute("ROLLBACK TO append")
                self._reload()  # inside the transaction: sees the group's earlier appends
                result = self._attempt(batches, stamp, optimistic=False)
        except BaseException:
            if savepoint:
                db.execute("ROLLBACK TO append")
                db.execute("RELEASE append")
            raise
        if savepoint:
            db.execute("RELEASE append")
        return result

    def _attempt(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]], stamp: str, optimistic: bool
    ) -> list[AppendResult]:
        """Optimistic: head and versions from this connection's cache, no lookup of stored
        ids (the insert trigger refuses a stored id, a stale head or version, so a wrong
        guess cannot be written). Otherwise every lookup, which tells a retried batch (its
        original positions) or a conflict (ConflictError) from a real error."""
        plan, results = self._plan(batches, optimistic)
        self._head = self._insert(plan, stamp) if plan else self._head
        for stream, events, _, version in plan:
            self._versions[stream] = version + len(events)
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
        try:
            with self._commit_lock, self._tx() as db:
                self._seen = None  # the head moves past what the append path knows
                head = db.execute(self._q["head_row"]).fetchone()
                self._write_rows(chained_rows(events, *(head or (0, GENESIS_HASH))))
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"import refused by the ledger: {exc}") from exc

    def _insert(self, plan: list[tuple[str, Sequence[NewEvent], list[str], int]], stamp: str) -> tuple[int, str]:
        """Seal and insert the planned events; the new head (seq, hash)."""
        seq, prev_hash = self._head
        rows: list[tuple] = []
        actor_text = ActorTexts()
        for stream, events, ids, version in plan:
            for new, id_ in zip(events, ids, strict=True):
                seq += 1
                version += 1
                time_ = new.time or stamp
                actor_json = actor_text(new.actor)
                data_json = dumps(new.data)
                hash_ = sealed_hash(seq, stream, version, new.type, time_, actor_json, id_, new.causation, data_json, prev_hash)
                rows.append((seq, stream, version, new.type, time_, actor_json, id_, new.causation, data_json, prev_hash, hash_))
                prev_hash = hash_
        self._write_rows(rows)
        return seq, prev_hash

    def refresh_statistics(self) -> None:
        """Nothing to refresh: every read is by rowid range or by the one index that fits."""

    def _write_rows(self, rows: list[tuple]) -> None:
        """INSERT rows in order: whole chunks of _ROWS_PER_INSERT (or what the library
        allows) as one statement each, the rest row by row (a lone event is one statement
        either way)."""
        db, n = self._db, self._per_insert
        whole = len(rows) - len(rows) % n
        if whole:
            statement = self._q["insert_many"]
            for start in range(0, whole, n):
                db.execute(statement, [value for row in rows[start:start + n] for value in row])
        if whole < len(rows):
            db.executemany(self._q["insert"], rows[whole:])

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

    def stream_rows(self, streams: Collection[str], types: Collection[str], until: int) -> list[tuple]:
        return self._db.execute(self._q["stream_rows"], (json.dumps(sorted(streams)), json.dumps(sorted(types)), until)).fetchall()

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
        if self._read_db is not None:
            self._read_db.close()
            self._read_db = None
        super().close()
