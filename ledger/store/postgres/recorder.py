"""The shared ledger's event log: append, read, scan (the `Recorder` of ledger/store/base.py).

- Global order = commit order. Every writing transaction first locks the single row of
  `head` (`SELECT ... FOR UPDATE`), which holds the last seq and the last hash (the chain
  needs the hash anyway). Writers therefore run one after another: the next writer reads
  the head only after the previous one committed, and PostgreSQL makes a commit visible
  before it releases its row locks, so a reader that sees seq N already sees every seq < N.
  Paged reads (`seq > after ORDER BY seq LIMIT n`) never miss a late event below a page.
- One round trip per append: `append_one()` (one event; scalar arguments) or
  `append_batches()` (anything else; column arrays), PL/pgSQL in schema.sql, locks the head,
  checks versions and idempotency keys, chains, inserts, moves the head and NOTIFYs, in
  autocommit.
  The hashed bytes are ledger.events.body_text's: this module cuts each event's body into
  the text before and after the parts only the server knows (prev_hash, seq, version), and
  the server splices those in (`_MID`, `_TAIL` below are the only layout it adds).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import psycopg

from ledger.errors import ConflictError, StoreError, UsageError
from ledger.events import Event, NewEvent, body_text, dumps, now
from ledger.store.base import (
    ActorTexts,
    AppendOne,
    AppendResult,
    chained_rows,
    check_stream,
    check_type,
    event_from_row,
)
from ledger.store.postgres.database import PgDatabase

PAGE = 10_000  # rows per round trip when reading in seq order
_NO_LIMIT = 2**62

# event_hash (schema.sql) hashes prev_hash || pre || prev_hash || _MID || seq || post || version || _TAIL.
_MID = '","seq":'
_TAIL = "}"
_PREFIX = '"prev_hash":"'
_MARK = _PREFIX + _MID + "0"  # body_text's output around prev_hash "" and seq 0


def splice_parts(
    stream: str, type_: str, time: str, actor_json: str, id_: str, causation: str | None, data_json: str
) -> tuple[str, str]:
    """(pre, post): an event's canonical body (body_text) without its prev_hash, seq and
    version, cut where event_hash (schema.sql) splices them back in."""
    body = body_text(0, stream, 0, type_, time, actor_json, id_, causation, data_json, "")
    # The last mark is the envelope's own: what follows it (stream, time, type) are JSON
    # strings whose quotes are escaped, so they cannot hold it; data (before it) can.
    cut = body.rfind(_MARK)
    return body[: cut + len(_PREFIX)], body[cut + len(_MARK) : -len("0" + _TAIL)]


def _check_splice() -> None:
    """The splice must give body_text's bytes, even for data that mimics the envelope."""
    data = dumps({"x": '"prev_hash":"","seq":0,"', "prev_hash": "", "seq": 0, "version": 0})
    args = ("a/b", "note", "2026-01-01T00:00:00.000000Z", dumps({"k": "v"}), "id-1", None, data)
    pre, post = splice_parts(*args)
    prev = "ab" * 32
    spliced = prev + pre + prev + _MID + "12" + post + "7" + _TAIL
    if spliced != prev + body_text(12, args[0], 7, *args[1:], prev):
        raise RuntimeError("ledger.events.body_text's layout changed: update event_hash (schema.sql) and _MID/_TAIL")


_check_splice()


class PostgresRecorder(AppendOne):
    _db: PgDatabase

    # -- writing --------------------------------------------------------------------------
    def append_many(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], int | None]]
    ) -> list[AppendResult]:
        stamp = now()  # one instant per transaction: the batch is one decision
        streams: list[str] = []
        expected: list[int | None] = []
        counts: list[int] = []
        # ids, types, times, actors, causations, datas, pre, post, keyed
        cols: list[list] = [[] for _ in range(9)]
        ids, types, times, actors, causations, datas, pres, posts, keyed = cols
        actor_text = ActorTexts()
        for stream, events, exp in batches:
            check_stream(stream)
            streams.append(stream)
            expected.append(exp)
            counts.append(len(events))
            first = len(ids)
            for new in events:
                check_type(new.type)
                id_ = new.resolve_id(stream)
                time_ = new.time or stamp
                actor = actor_text(new.actor)
                data = dumps(new.data)
                ids.append(id_)
                keyed.append(id_ if new.key is not None else None)
                types.append(new.type)
                times.append(time_)
                actors.append(actor)
                causations.append(new.causation)
                datas.append(data)
                pre, post = splice_parts(stream, new.type, time_, actor, id_, new.causation, data)
                pres.append(pre)
                posts.append(post)
            if len(set(ids[first:])) != len(ids) - first:
                raise UsageError(f"a batch for stream {stream!r} repeats an idempotency key")
        db = self._db
        with db.lock:
            try:
                if len(ids) == len(streams) == 1:  # one event on one stream: the common case, the cheap call
                    dup, seq, version = db.cursor.execute(db.q["append_one"], (  # type: ignore[misc]
                        streams[0], expected[0], ids[0], types[0], times[0], actors[0], causations[0], datas[0],
                        pres[0], posts[0], keyed[0] is not None), prepare=True).fetchone()
                    return [AppendResult((seq,), version, dup)]
                rows = db.conn.execute(db.q["append"], (streams, expected, counts, *cols)).fetchall()  # type: ignore[arg-type]
            except psycopg.Error as exc:
                if exc.sqlstate == "LDG02":
                    found, total, first_seq = (exc.diag.message_detail or "0 0 0").split()
                    raise UsageError(
                        f"{found} of the {total} events appended to {exc.diag.message_primary!r} are stored already "
                        f"(from seq {first_seq}) but the others are not",
                        hint="a retried batch must be the same batch, with an idempotency key on every event",
                    ) from None
                if exc.sqlstate == "LDG01":
                    exp_text, actual = (exc.diag.message_detail or "-1 -1").split()
                    raise ConflictError(exc.diag.message_primary or "", int(exp_text), int(actual)) from None
                raise self._append_error(exc, "nothing was stored; retry") from exc
        return [AppendResult(tuple(positions), version, duplicate) for duplicate, positions, version in rows]

    def import_events(self, events: Sequence[Event]) -> None:
        if not events:
            return
        db = self._db
        with db.lock:
            try:
                with db.conn.transaction():
                    head = db.conn.execute(db.q["lock_head"]).fetchone()
                    rows = chained_rows(events, *head)
                    with db.conn.pipeline():
                        db.conn.execute(db.q["insert"], [list(col) for col in zip(*rows, strict=True)])  # type: ignore[arg-type]
                        db.conn.execute(db.q["move_head"], (events[-1].seq, events[-1].hash))  # type: ignore[arg-type]
                        db.conn.execute(db.q["notify_head"], (events[-1].seq,))  # type: ignore[arg-type]
            except psycopg.Error as exc:
                raise self._append_error(exc, "retry; the append was rolled back") from exc

    def refresh_statistics(self) -> None:
        """ANALYZE the events table: after a bulk load, autovacuum analyzes it a minute later
        at best, and never where it is off; until then the planner guesses (on a migrated 1M
        ledger, `ledger tpus` waited 0.58 s for the server, which scanned the table for its
        TPUs' health; 0.04 s after, for an ANALYZE of 0.7 s). A role that does not own the
        table gets a warning from the server, not an error."""
        self._db.execute(self._db.q["analyze"])

    def _append_error(self, exc: psycopg.Error, hint: str) -> StoreError:
        if isinstance(exc, psycopg.errors.UniqueViolation):
            return StoreError(f"append refused by {self._db.safe_url}: {exc.diag.message_primary}",
                              hint="two events of one call share an idempotency key")
        return StoreError(f"append to {self._db.safe_url} failed: {exc}", hint=hint)

    # -- reading --------------------------------------------------------------------------
    def _one(self, query: str, params: tuple = ()) -> tuple | None:
        db = self._db
        with db.lock:
            return db.conn.execute(db.q[query], params).fetchone()  # type: ignore[arg-type]

    def head(self) -> int:
        return self._one("head")[0]  # type: ignore[index]

    def read_all(self, after: int = 0, limit: int | None = None) -> Iterator[Event]:
        for rows in self._pages("page", after, None, limit):
            yield from map(event_from_row, rows)

    def read_stream(self, stream: str, after_version: int = 0) -> list[Event]:
        return [event_from_row(r) for r in self._db.execute(self._db.q["stream"], (stream, after_version))]

    def get_event(self, event_id: str) -> Event | None:
        row = self._one("event", (event_id,))
        return event_from_row(row) if row else None

    def hash_at(self, seq: int) -> str | None:
        row = self._one("hash_at", (seq,))
        return row[0] if row else None

    def stream_version(self, stream: str) -> int:
        row = self._one("version", (stream,))
        return row[0] if row else 0

    def streams(self) -> list[str]:
        return [r[0] for r in self._db.execute(self._db.q["streams"])]

    def position_at_time(self, iso_time: str) -> int:
        return self._one("at_time", (iso_time,))[0] or 0  # type: ignore[index]

    def stream_rows(self, streams: Collection[str], types: Collection[str], until: int) -> list[tuple]:
        return self._db.execute(self._db.q["stream_rows"], (sorted(streams), sorted(types), until))

    def raw_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        for rows in self._pages("page", after, until, None):
            yield from rows

    def fold_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        for rows in self._pages("fold_page", after, until, None):
            yield from rows

    def _pages(self, query: str, after: int, until: int | None, limit: int | None) -> Iterator[list[tuple]]:
        # Keyset pages, each its own snapshot: safe because seq order is commit order, so a
        # later page can hold nothing that belonged before an earlier one. While the caller
        # works on a page (a replay folds it), the next one is read on a helper thread, so the
        # server's scan and the transfer overlap the fold instead of adding to it; the thread
        # starts at the second page, so short reads (a tail, one page) never make one.
        until = until if until is not None else _NO_LIMIT
        left = limit if limit is not None else -1
        statement = self._db.q[query]

        def fetch(after: int, size: int) -> list[tuple]:
            # The page's rows by their seqs (after + 1 .. after + size), not "the next `size`
            # after": seqs have no gaps (the growth trigger), and a planner without statistics
            # (a ledger just migrated or restored, before autovacuum's ANALYZE) guesses an
            # open range small and sorts all of it for every page: quadratic in the ledger.
            upper = min(until, after + size)
            rows = self._db.execute(statement, (after, upper, size))
            if len(rows) < size and upper < until:
                # The head, or a gap (only an owner who turned the trigger off can leave one):
                # what follows, asked the open way, so every reader reads past a gap and verify
                # reports it. A read up to the head (replay's, verify's) never asks twice.
                rows += self._db.execute(statement, (rows[-1][0] if rows else after, until, size - len(rows)))
            return rows

        size = PAGE if left < 0 else min(PAGE, left)
        rows = fetch(after, size)
        pool: ThreadPoolExecutor | None = None
        try:
            while rows:
                if left > 0:
                    left -= len(rows)
                ahead = None
                if len(rows) == size and left != 0 and rows[-1][0] < until:
                    size = PAGE if left < 0 else min(PAGE, left)
                    pool = pool or ThreadPoolExecutor(1, thread_name_prefix="ledger-read-ahead")
                    ahead = pool.submit(fetch, rows[-1][0], size)
                yield rows
                if ahead is None:
                    return
                rows = ahead.result()
        finally:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
