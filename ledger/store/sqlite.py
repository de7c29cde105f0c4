"""The embedded ledger: one SQLite file, append-only enforced by triggers.

Settings and why:
- journal_mode=WAL: readers never block the writer, and a crash leaves no half-written page.
- synchronous=FULL: the WAL is fsynced at every commit, so an append that returned survives
  power loss, not only a killed process (NORMAL would lose the last commits on power loss).
- BEGIN IMMEDIATE: the write lock is taken before reading the head, so several processes
  appending at once serialise and never produce a gap or a duplicate seq/version.
- busy_timeout: a writer waits for another instead of failing at once.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from ledger.errors import ConflictError, StoreError, UsageError
from ledger.events import GENESIS_HASH, Event, NewEvent, body_text, dumps, now, row_hash
from ledger.store.base import (
    FORMAT_VERSION,
    AppendResult,
    Snapshot,
    check_format,
    check_stream,
    check_type,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    stream TEXT NOT NULL,
    version INTEGER NOT NULL,
    type TEXT NOT NULL,
    time TEXT NOT NULL,
    actor TEXT NOT NULL,
    id TEXT NOT NULL UNIQUE,
    causation TEXT,
    data TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    UNIQUE (stream, version)
);
-- No index on time: it would cost every append ~20%, and only `replay --until TIME` needs it
-- (a scan of a million rows in C takes a fraction of a second).
-- Even a writer that bypasses this code (the sqlite3 shell, another tool) can only extend
-- the chain: the next seq, the stream's next version, chained to the head's hash.
CREATE TRIGGER IF NOT EXISTS events_contiguous BEFORE INSERT ON events
WHEN NEW.seq IS NOT (SELECT IFNULL(MAX(seq), 0) + 1 FROM events)
  OR NEW.version IS NOT (SELECT IFNULL(MAX(version), 0) + 1 FROM events WHERE stream = NEW.stream)
  OR NEW.prev_hash IS NOT IFNULL((SELECT hash FROM events WHERE seq = NEW.seq - 1), '0000000000000000000000000000000000000000000000000000000000000000')
BEGIN SELECT RAISE(ABORT, 'the ledger only grows at its head: seq, version or prev_hash out of order'); END;
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only: events cannot be updated'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only: events cannot be deleted'); END;
CREATE TABLE IF NOT EXISTS snapshots (
    name TEXT NOT NULL,
    code_version TEXT NOT NULL,
    position INTEGER NOT NULL,
    state BLOB NOT NULL,
    PRIMARY KEY (name, code_version, position)
);
CREATE TABLE IF NOT EXISTS cursors (name TEXT PRIMARY KEY, position INTEGER NOT NULL);
"""

COLUMNS = "seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash"
INSERT = f"INSERT INTO events ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
# What the fold needs, in replay order: data stays canonical JSON text until decoded.
FOLD_COLUMNS = "seq, stream, version, type, time, data"


def _row_to_event(row: tuple) -> Event:
    seq, stream, version, type_, time_, actor, id_, causation, data, prev_hash, hash_ = row
    return Event(seq, stream, version, type_, time_, json.loads(actor), id_, causation, json.loads(data), prev_hash, hash_)


class SQLiteStore:
    def __init__(self, path: str | Path, *, create: bool = True, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self._read_db: sqlite3.Connection | None = None
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA", "OFF"):
            raise UsageError(f"unknown synchronous setting {synchronous!r}")
        if not self.path.exists():
            if not create:
                raise StoreError(f"no ledger at {self.path}", hint="check --store / LEDGER_STORE")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create {self.path.parent}: {exc.strerror}") from exc
        try:
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout = 30000")
            self._use_wal()
            self._db.execute(f"PRAGMA synchronous = {synchronous}")
            # A bigger page cache keeps the id and (stream, version) indexes in memory during
            # batched appends. No mmap: it made a full scan count the whole file in RSS and
            # bought nothing measurable for sequential reads.
            self._db.execute("PRAGMA cache_size = -65536")
            self._init_schema(create)
        except sqlite3.DatabaseError as exc:
            with contextlib.suppress(Exception):
                self._db.close()
            raise StoreError(
                f"cannot open ledger {self.path}: {exc}",
                hint="is it a tpu-ledger SQLite file, readable, and not locked by a crashed tool?",
            ) from exc

    # -- set-up ---------------------------------------------------------------------------
    def _use_wal(self) -> None:
        """Switch a new file to WAL. The switch needs an exclusive lock and SQLite does not
        wait for it through the busy handler, so two openers of a brand-new ledger (a
        writer and a reader thread, say) retry that moment instead of failing."""
        deadline = time.monotonic() + 30
        while True:
            try:
                if self._db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _init_schema(self, create: bool) -> None:
        row = None
        with contextlib.suppress(sqlite3.OperationalError):  # a new file: no meta table yet
            row = self._db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        if row is not None:
            check_format(row[0], str(self.path))
            return
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables - {"meta", "events", "snapshots", "cursors"}:
            raise StoreError(f"{self.path} is an SQLite database but not a tpu-ledger ledger",
                             hint="point --store / LEDGER_STORE at a ledger file")
        if not create and not tables:
            raise StoreError(f"no ledger at {self.path} (an empty file)", hint="check --store / LEDGER_STORE")
        # executescript runs its own statements; the script is one transaction, and
        # IF NOT EXISTS makes two processes creating the same file at once harmless.
        self._db.executescript(
            "BEGIN IMMEDIATE;" + SCHEMA
            + f"INSERT OR IGNORE INTO meta (key, value) VALUES ('format', '{FORMAT_VERSION}'); COMMIT;"
        )

    def _begin(self) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreError(f"ledger {self.path} is locked: {exc}", hint="another process holds it; retry") from exc

    # -- writing --------------------------------------------------------------------------
    def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int | None = None
    ) -> AppendResult:
        return self.append_many([(stream, events, expected_version)])[0]

    def append_many(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]]
    ) -> list[AppendResult]:
        db = self._db
        stamp = now()  # one instant per transaction: the batch is one decision
        self._begin()
        try:
            head = db.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
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
                db.executemany(INSERT, rows)
            db.execute("COMMIT")
            return results
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def import_events(self, events: Sequence[Event]) -> None:
        """Store sealed envelopes as they are, after checking each continues the chain."""
        db = self._db
        self._begin()
        try:
            head = db.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
            seq, prev_hash = head if head else (0, GENESIS_HASH)
            rows = []
            for ev in events:
                row = self._row(ev)
                if ev.seq != seq + 1 or ev.prev_hash != prev_hash or row_hash(ev.prev_hash, body_text(*row[:10])) != ev.hash:
                    raise StoreError(f"event seq {ev.seq} does not continue the chain at seq {seq}")
                seq, prev_hash = ev.seq, ev.hash
                rows.append(row)
            db.executemany(INSERT, rows)
            db.execute("COMMIT")
        except sqlite3.IntegrityError as exc:
            db.execute("ROLLBACK")
            raise StoreError(f"import refused by the ledger: {exc}") from exc
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @staticmethod
    def _row(ev: Event) -> tuple:
        return (
            ev.seq, ev.stream, ev.version, ev.type, ev.time, dumps(ev.actor), ev.id,
            ev.causation, dumps(ev.data), ev.prev_hash, ev.hash,
        )

    def _stored_positions(self, ids: list[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            found.update(self._db.execute(f"SELECT id, seq FROM events WHERE id IN ({marks})", chunk).fetchall())
        return found

    def _version(self, stream: str, pending: dict[str, int]) -> int:
        if stream in pending:
            return pending[stream]
        row = self._db.execute("SELECT MAX(version) FROM events WHERE stream = ?", (stream,)).fetchone()
        return row[0] or 0

    # -- reading --------------------------------------------------------------------------
    def read_all(self, after: int = 0, limit: int | None = None) -> Iterator[Event]:
        sql = f"SELECT {COLUMNS} FROM events WHERE seq > ? ORDER BY seq"
        params: tuple = (after,)
        if limit is not None:
            sql += " LIMIT ?"
            params = (after, limit)
        cur = self._db.execute(sql, params)
        while rows := cur.fetchmany(4096):
            yield from map(_row_to_event, rows)

    def read_stream(self, stream: str, after_version: int = 0) -> list[Event]:
        cur = self._db.execute(
            f"SELECT {COLUMNS} FROM events WHERE stream = ? AND version > ? ORDER BY version",
            (stream, after_version),
        )
        return [_row_to_event(r) for r in cur.fetchall()]

    def get_event(self, event_id: str) -> Event | None:
        row = self._db.execute(f"SELECT {COLUMNS} FROM events WHERE id = ?", (event_id,)).fetchone()
        return _row_to_event(row) if row else None

    def head(self) -> int:
        row = self._db.execute("SELECT MAX(seq) FROM events").fetchone()
        return row[0] or 0

    def stream_version(self, stream: str) -> int:
        return self._version(stream, {})

    def streams(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT DISTINCT stream FROM events ORDER BY stream")]

    def position_at_time(self, iso_time: str) -> int:
        row = self._db.execute("SELECT MAX(seq) FROM events WHERE time <= ?", (iso_time,)).fetchone()
        return row[0] or 0

    def raw_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        """Undecoded rows (COLUMNS order; actor and data as stored canonical JSON text) in seq
        order, for verification and export: `events.body_text(*row[:10])` rebuilds the hashed bytes."""
        return self._scan(COLUMNS, after, until)

    def fold_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        """(seq, stream, version, type, time, data JSON text) in seq order: only what the fold reads."""
        return self._scan(FOLD_COLUMNS, after, until)

    def _scan(self, columns: str, after: int, until: int | None) -> Iterator[tuple]:
        # A separate read connection: a long scan must not hold this one's transaction state,
        # and WAL gives it a stable view of the ledger at its start.
        # The cursor itself is the iterator: rows are stepped in C, with no generator layer
        # (which cost a third of the row fetch of a full replay). Exhausted, it resets its
        # statement; dropped early, it is finalized when released.
        return self._reader().execute(
            f"SELECT {columns} FROM events WHERE seq > ? AND seq <= ? ORDER BY seq",
            (after, until if until is not None else 2**62),
        )

    def _reader(self) -> sqlite3.Connection:
        if self._read_db is None:
            self._read_db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            self._read_db.execute("PRAGMA cache_size = -8192")  # scans are sequential
        return self._read_db

    def count_since(self, after: int) -> int:
        row = self._db.execute("SELECT COUNT(*) FROM events WHERE seq > ?", (after,)).fetchone()
        return row[0]


    # -- snapshots and cursors ------------------------------------------------------------
    def save_snapshot(self, snapshot: Snapshot) -> None:
        with self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO snapshots (name, code_version, position, state) VALUES (?,?,?,?)",
                (snapshot.name, snapshot.code_version, snapshot.position, snapshot.state),
            )
            # Keep the newest few per name: older ones only cost space.
            self._db.execute(
                "DELETE FROM snapshots WHERE name = ? AND position NOT IN "
                "(SELECT position FROM snapshots WHERE name = ? ORDER BY position DESC LIMIT 3)",
                (snapshot.name, snapshot.name),
            )

    def load_snapshot(self, name: str, code_version: str, at_most: int | None = None) -> Snapshot | None:
        row = self._db.execute(
            "SELECT position, state FROM snapshots WHERE name = ? AND code_version = ? AND position <= ? "
            "ORDER BY position DESC LIMIT 1",
            (name, code_version, at_most if at_most is not None else 2**62),
        ).fetchone()
        return Snapshot(name, code_version, row[0], bytes(row[1])) if row else None

    def get_cursor(self, name: str) -> int:
        row = self._db.execute("SELECT position FROM cursors WHERE name = ?", (name,)).fetchone()
        return row[0] if row else 0

    def set_cursor(self, name: str, position: int) -> None:
        with self._tx():
            self._db.execute(
                "INSERT INTO cursors (name, position) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET position = MAX(position, excluded.position)",
                (name, position),
            )

    def wait_for_append(self, after: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while True:
            head = self.head()
            if head > after or time.monotonic() >= deadline:
                return head
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def _tx(self):
        store = self

        class _Tx:
            def __enter__(self) -> None:
                store._db.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, exc, tb) -> None:
                store._db.execute("ROLLBACK" if exc_type else "COMMIT")

        return _Tx()

    def close(self) -> None:
        if self._read_db is not None:
            self._read_db.close()
            self._read_db = None
        self._db.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
