"""The embedded ledger's event log: append, read, scan (the `Recorder` of ledger/store/base.py)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence

from ledger.errors import ConflictError, StoreError, UsageError
from ledger.events import GENESIS_HASH, Event, NewEvent, body_text, dumps, now, row_hash
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


class SQLiteRecorder(AppendOne, SQLiteDatabase):
    _read_db: sqlite3.Connection | None = None

    # -- writing --------------------------------------------------------------------------
    def append_many(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]]
    ) -> list[AppendResult]:
        stamp = now()  # one instant per transaction: the batch is one decision
        with self._tx() as db:
            head = db.execute(self._q["head_row"]).fetchone()
            seq, prev_hash = head if head else (0, GENESIS_HASH)
            results: list[AppendResult] = []
            rows: list[tuple] = []
            versions: dict[str, int] = {}
            # Writers pass the same actor dict for many events: encode each object once.
            actors: dict[int, tuple[object, str]] = {}
            for stream, events, expected in batches:
                check_stream(stream)
                ids = [e.resolve_id(stream) for e in events]
                # Only keyed events can be retries; random ids are new by construction
                # (and the UNIQUE index would still refuse a collision).
                keyed = [i for i, e in zip(ids, events, strict=True) if e.key is not None]
                stored = self._stored_positions(keyed) if keyed else {}
                if stored and len(stored) == len(ids):
                    results.append(AppendResult(tuple(stored[i] for i in ids), self._version(stream, versions), True))
                    continue
                if stored:  # a retry must repeat the same batch, every event keyed
                    raise UsageError(
                        f"{len(stored)} of the {len(ids)} events appended to {stream!r} are stored already "
                        f"(from seq {min(stored.values())}) but the others are not",
                        hint="a retried batch must be the same batch, with an idempotency key on every event",
                    )
                if len(set(ids)) != len(ids):
                    raise UsageError(f"a batch for stream {stream!r} repeats an idempotency key")
                version = self._version(stream, versions)
                if expected is not None and expected != version:
                    raise ConflictError(stream, expected, version)
                positions = []
                for new, id_ in zip(events, ids, strict=True):
                    check_type(new.type)
                    seq += 1
                    version += 1
                    time_ = new.time or stamp
                    cached = actors.get(id(new.actor))
                    if cached is None or cached[0] is not new.actor:
                        cached = actors[id(new.actor)] = (new.actor, dumps(new.actor))
                    actor_json = cached[1]
                    data_json = dumps(new.data)
                    body = body_text(seq, stream, version, new.type, time_, actor_json, id_,
                                     new.causation, data_json, prev_hash)
                    hash_ = row_hash(prev_hash, body)
                    rows.append((seq, stream, version, new.type, time_, actor_json, id_,
                                 new.causation, data_json, prev_hash, hash_))
                    prev_hash = hash_
                    positions.append(seq)
                versions[stream] = version
                results.append(AppendResult(tuple(positions), version, False))
            if rows:
                db.executemany(self._q["insert"], rows)
        return results

    def import_events(self, events: Sequence[Event]) -> None:
        """Store sealed envelopes as they are, after checking each continues the chain."""
        try:
            with self._tx() as db:
                head = db.execute(self._q["head_row"]).fetchone()
                db.executemany(self._q["insert"], chained_rows(events, *(head or (0, GENESIS_HASH))))
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"import refused by the ledger: {exc}") from exc

    def _stored_positions(self, ids: list[str]) -> dict[str, int]:
        return dict(self._db.execute(self._q["stored_ids"], (json.dumps(ids),)).fetchall())

    def _version(self, stream: str, pending: dict[str, int]) -> int:
        if stream in pending:
            return pending[stream]
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
        return self._version(stream, {})

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
        if self._read_db is not None:
            self._read_db.close()
            self._read_db = None
        super().close()
