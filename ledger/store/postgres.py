"""The shared ledger: PostgreSQL, for teams whose watcher and reconcilers run on several hosts.

Same contract as the SQLite store (ledger/store/base.py). How each guarantee is kept:

- Global order = commit order. Every writing transaction first locks the single row of
  `head` (`SELECT ... FOR UPDATE`), which holds the last seq and the last hash (the chain
  needs the hash anyway). Writers therefore run one after another: the next writer reads
  the head only after the previous one committed, and PostgreSQL makes a commit visible
  before it releases its row locks, so a reader that sees seq N already sees every seq < N.
  Paged reads (`seq > after ORDER BY seq LIMIT n`) never miss a late event below a page.
- Append-only: triggers refuse UPDATE, DELETE and TRUNCATE on `events`, and the role
  `ledger_writer` (created when the connecting user may) holds SELECT/INSERT only on it.
- The chain only grows at its head, even for a writer that bypasses this code: an AFTER
  INSERT statement trigger checks each new row against the one before it.
- One round trip per append: `append_batches()` (PL/pgSQL) locks the head, checks versions
  and idempotency keys, chains (SHA-256 over the canonical JSON the client escaped, so the
  hash is byte for byte ledger.events'), inserts and moves the head, in autocommit.
- LISTEN/NOTIFY: a trigger on `head` notifies `<schema>_appended` with the new head seq, so
  `wait_for_append` sleeps until a commit instead of polling.

Everything lives in one PostgreSQL schema (default `ledger`; `?schema=name` in the URL or
`schema=` picks another), so several ledgers, or tests, can share one database.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator, Sequence
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from ledger.errors import ConflictError, StoreError, UsageError
from ledger.events import (
    GENESIS_HASH,
    Event,
    NewEvent,
    body_around,
    body_text,
    dumps,
    now,
    row_hash,
)
from ledger.store.base import (
    FORMAT_VERSION,
    AppendResult,
    Snapshot,
    check_format,
    check_stream,
    check_type,
)

WRITER_ROLE = "ledger_writer"
PAGE = 10_000  # rows per round trip when reading in seq order

# {s} is the quoted schema name. Text columns use the "C" collation: byte order, as SQLite
# sorts, and ISO times compare as instants.
SCHEMA_DDL = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.events (
    seq bigint PRIMARY KEY CHECK (seq > 0),
    stream text COLLATE "C" NOT NULL,
    version bigint NOT NULL CHECK (version > 0),
    type text COLLATE "C" NOT NULL,
    time text COLLATE "C" NOT NULL,
    actor text NOT NULL,
    id text COLLATE "C" NOT NULL UNIQUE,
    causation text,
    data text NOT NULL,
    prev_hash text COLLATE "C" NOT NULL,
    hash text COLLATE "C" NOT NULL,
    UNIQUE (stream, version)
);
CREATE TABLE IF NOT EXISTS {s}.head (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    seq bigint NOT NULL,
    hash text NOT NULL
);
INSERT INTO {s}.head (one, seq, hash) VALUES (true, 0, '{genesis}') ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS {s}.snapshots (
    name text COLLATE "C" NOT NULL,
    code_version text COLLATE "C" NOT NULL,
    position bigint NOT NULL,
    state bytea NOT NULL,
    PRIMARY KEY (name, code_version, position)
);
CREATE TABLE IF NOT EXISTS {s}.cursors (name text COLLATE "C" PRIMARY KEY, position bigint NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.leases (
    name text COLLATE "C" PRIMARY KEY,
    holder text NOT NULL,
    expires_at timestamptz NOT NULL,
    token bigint NOT NULL
);
CREATE OR REPLACE FUNCTION {s}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only: % on events is refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END $$;
CREATE OR REPLACE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON {s}.events
    FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change();
CREATE OR REPLACE TRIGGER events_no_truncate BEFORE TRUNCATE ON {s}.events
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change();
-- p_keyed holds the ids of keyed events (NULL for random ids, which cannot be retries).
-- One round trip per append: lock the head, check versions and ids, chain and insert.
-- The canonical JSON around seq, version and prev_hash comes escaped from the client
-- (pre/post), so the server only splices numbers and the previous hash into it and
-- the hash is byte for byte what ledger.events computes.
CREATE OR REPLACE FUNCTION {s}.append_batches(
    p_streams text[], p_expected bigint[], p_counts int[], p_ids text[], p_types text[],
    p_times text[], p_actors text[], p_causations text[], p_datas text[], p_pre text[], p_post text[],
    p_keyed text[]
) RETURNS TABLE (duplicate boolean, positions bigint[], version bigint)
LANGUAGE plpgsql AS $$
DECLARE
    h_seq bigint;
    h_hash text;
    first_seq bigint;
    off int := 0;
    n int;
    v bigint;
    found_n int;
    found_seqs bigint[];
    seqs bigint[];
    -- One entry per event of the call (NULL = not inserted: a retried batch), so a single
    -- INSERT zips them with the p_ arrays at the end: one statement, one trigger run.
    a_seq bigint[] := '{{}}';
    a_stream text[] := '{{}}';
    a_ver bigint[] := '{{}}';
    a_prev text[] := '{{}}';
    a_hash text[] := '{{}}';
    touched text[] := '{{}}';
    pending boolean := false;
    r record;
BEGIN
    SELECT h.seq, h.hash INTO h_seq, h_hash FROM {s}.head h FOR UPDATE;
    first_seq := h_seq;
    FOR b IN 1 .. coalesce(array_length(p_streams, 1), 0) LOOP
        n := p_counts[b];
        IF pending AND p_streams[b] = ANY(touched) THEN
            -- A stream seen earlier in this call: store what is pending so lookups see it.
            INSERT INTO {s}.events (seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash)
            SELECT x.seq, x.stream, x.ver, x.type, x.time, x.actor, x.id, x.causation, x.data, x.prev, x.hash
            FROM unnest(a_seq, a_stream, a_ver, p_types[1 : off], p_times[1 : off], p_actors[1 : off],
                        p_ids[1 : off], p_causations[1 : off], p_datas[1 : off], a_prev, a_hash)
                AS x(seq, stream, ver, type, time, actor, id, causation, data, prev, hash)
            WHERE x.seq IS NOT NULL;
            a_seq := array_fill(NULL::bigint, ARRAY[off]);
            pending := false;
        END IF;
        touched := array_append(touched, p_streams[b]);
        SELECT e.version INTO v FROM {s}.events e WHERE e.stream = p_streams[b] ORDER BY e.version DESC LIMIT 1;
        v := coalesce(v, 0);
        -- A scalar subquery per id: an index probe each, never a scan of the ledger.
        SELECT count(f.seq), array_agg(f.seq ORDER BY f.ord) INTO found_n, found_seqs
            FROM (SELECT x.ord, (SELECT e.seq FROM {s}.events e WHERE e.id = x.id) AS seq
                  FROM unnest(p_keyed[off + 1 : off + n]) WITH ORDINALITY AS x(id, ord)) f
            WHERE f.seq IS NOT NULL;
        IF found_n = n AND n > 0 THEN
            duplicate := true; positions := found_seqs; version := v;
            RETURN NEXT;
            FOR i IN 1 .. n LOOP
                a_seq := array_append(a_seq, NULL::bigint);
                a_stream := array_append(a_stream, NULL::text);
                a_ver := array_append(a_ver, NULL::bigint);
                a_prev := array_append(a_prev, NULL::text);
                a_hash := array_append(a_hash, NULL::text);
            END LOOP;
        ELSIF found_n > 0 THEN
            -- A retry must repeat the same batch: some stored and some not is a caller's mistake.
            RAISE EXCEPTION USING ERRCODE = 'LDG02', MESSAGE = p_streams[b],
                DETAIL = found_n::text || ' ' || n::text || ' ' || found_seqs[1]::text;
        ELSIF p_expected[b] IS NOT NULL AND p_expected[b] <> v THEN
            RAISE EXCEPTION USING ERRCODE = 'LDG01', MESSAGE = p_streams[b],
                DETAIL = coalesce(p_expected[b], -1)::text || ' ' || v::text;
        ELSE
            seqs := '{{}}';
            FOR r IN SELECT x.pre, x.post FROM unnest(p_pre[off + 1 : off + n], p_post[off + 1 : off + n])
                    AS x(pre, post) LOOP
                h_seq := h_seq + 1;
                v := v + 1;
                a_prev := array_append(a_prev, h_hash);
                h_hash := encode(sha256(convert_to(
                    h_hash || r.pre || h_hash || '","seq":' || h_seq || r.post || v || '}}', 'UTF8')), 'hex');
                seqs := array_append(seqs, h_seq);
                a_seq := array_append(a_seq, h_seq);
                a_stream := array_append(a_stream, p_streams[b]);
                a_ver := array_append(a_ver, v);
                a_hash := array_append(a_hash, h_hash);
            END LOOP;
            pending := pending OR n > 0;
            duplicate := false; positions := seqs; version := v;
            RETURN NEXT;
        END IF;
        off := off + n;
    END LOOP;
    IF pending THEN
        -- Inline, not in an SQL function: PL/pgSQL keeps this statement's plan across calls.
        INSERT INTO {s}.events (seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash)
        SELECT x.seq, x.stream, x.ver, x.type, x.time, x.actor, x.id, x.causation, x.data, x.prev, x.hash
        FROM unnest(a_seq, a_stream, a_ver, p_types, p_times, p_actors, p_ids, p_causations, p_datas, a_prev, a_hash)
            AS x(seq, stream, ver, type, time, actor, id, causation, data, prev, hash)
        WHERE x.seq IS NOT NULL;
    END IF;
    IF h_seq > first_seq THEN
        UPDATE {s}.head SET seq = h_seq, hash = h_hash;
    END IF;
END $$;
-- Even a writer that bypasses append_batches (psql, another tool) can only extend the
-- chain: each new row's seq - 1 exists and its hash is the new row's prev_hash, and the
-- stream's previous version exists before it. With the primary key, seq stays 1..N.
CREATE OR REPLACE FUNCTION {s}.check_growth() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Inside the batch, each row is checked against the row before it (window functions);
    -- only the batch's first row, and each stream's first row, probe the stored ledger, by
    -- scalar subqueries (an index probe each, whatever the planner guesses about new_rows).
    IF EXISTS (
        SELECT 1 FROM (
            SELECT seq, stream, version, prev_hash,
                   lag(seq) OVER w AS p_seq, lag(hash) OVER w AS p_hash,
                   lag(version) OVER ws AS p_ver
            FROM new_rows
            WINDOW w AS (ORDER BY seq), ws AS (PARTITION BY stream ORDER BY seq)
        ) n
        WHERE CASE
                WHEN n.p_seq IS NOT NULL THEN n.p_seq <> n.seq - 1 OR n.p_hash <> n.prev_hash
                WHEN n.seq = 1 THEN n.prev_hash <> '{genesis}'
                ELSE n.prev_hash IS DISTINCT FROM (SELECT p.hash FROM {s}.events p WHERE p.seq = n.seq - 1)
              END
           OR CASE
                WHEN n.p_ver IS NOT NULL THEN n.p_ver <> n.version - 1
                WHEN n.version = 1 THEN false
                ELSE coalesce((SELECT sv.seq FROM {s}.events sv
                               WHERE sv.stream = n.stream AND sv.version = n.version - 1), n.seq) >= n.seq
              END
    ) THEN
        RAISE EXCEPTION 'the ledger only grows at its head: seq, version or prev_hash out of order'
            USING ERRCODE = 'LDG02';
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER events_grow_at_head AFTER INSERT ON {s}.events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {s}.check_growth();
CREATE OR REPLACE FUNCTION {s}.notify_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({channel}, NEW.seq::text);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER head_notify AFTER UPDATE ON {s}.head
    FOR EACH ROW WHEN (NEW.seq > OLD.seq) EXECUTE FUNCTION {s}.notify_append();
"""

# A role that can extend the ledger but never rewrite it. Roles are cluster-wide; creating
# it needs CREATEROLE, granting needs ownership: each step is skipped when not permitted.
ROLE_DDL = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {role}) THEN
        CREATE ROLE {role_id} NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation OR insufficient_privilege THEN NULL;
END $$;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = {role}) THEN
        GRANT USAGE ON SCHEMA {s} TO {role_id};
        GRANT SELECT ON {s}.meta TO {role_id};
        GRANT SELECT, INSERT ON {s}.events TO {role_id};
        GRANT SELECT, UPDATE ON {s}.head TO {role_id};
        GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.snapshots TO {role_id};
        GRANT SELECT, INSERT, UPDATE ON {s}.cursors TO {role_id};
        GRANT SELECT, INSERT, UPDATE ON {s}.leases TO {role_id};
    END IF;
EXCEPTION WHEN insufficient_privilege THEN NULL;
END $$;
"""

COLUMNS = "seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash"
ARRAY_TYPES = "bigint[], text[], bigint[], text[], text[], text[], text[], text[], text[], text[], text[]"


def _row_to_event(row: tuple) -> Event:
    seq, stream, version, type_, time_, actor, id_, causation, data, prev_hash, hash_ = row
    return Event(seq, stream, version, type_, time_, json.loads(actor), id_, causation, json.loads(data), prev_hash, hash_)


def _columns(events: Sequence[Event]) -> list[list]:
    """Column arrays for one `INSERT ... SELECT FROM unnest(...)`: one statement per batch."""
    cols: list[list] = [[] for _ in range(11)]
    for e in events:
        for col, value in zip(cols, (
            e.seq, e.stream, e.version, e.type, e.time, dumps(e.actor), e.id,
            e.causation, dumps(e.data), e.prev_hash, e.hash,
        ), strict=True):
            col.append(value)
    return cols


def split_url(url: str, schema: str | None) -> tuple[str, str]:
    """(libpq URL, schema): `?schema=` is ours, libpq would refuse it."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    from_url = [v for k, v in query if k == "schema"]
    rest = [(k, v) for k, v in query if k != "schema"]
    name = schema or (from_url[-1] if from_url else "ledger")
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", name):
        raise StoreError(f"invalid ledger schema name {name!r}", hint="use lower-case letters, digits and _")
    scheme = "postgresql" if parts.scheme == "postgres" else parts.scheme
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(rest, quote_via=quote), parts.fragment)), name


class PostgresStore:
    def __init__(self, url: str, *, create: bool = True, schema: str | None = None) -> None:
        self.url = url
        self._dsn, self.schema = split_url(url, schema)
        self.channel = f"{self.schema}_appended"
        self._lock = threading.RLock()
        self._listener: psycopg.Connection | None = None
        self._conn = self._connect()
        self._q = self._queries()
        try:
            self._init_schema(create)
        except BaseException:
            self._conn.close()
            raise

    def _connect(self) -> psycopg.Connection:
        try:
            return psycopg.connect(self._dsn, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(
                f"cannot connect to PostgreSQL ledger {self._safe_url()}: {first}",
                hint="is the server running and the URL right (postgresql://user@host:port/db)?",
            ) from exc

    def _safe_url(self) -> str:
        parts = urlsplit(self.url)
        netloc = parts.netloc.rsplit("@", 1)
        if len(netloc) == 2 and ":" in netloc[0]:  # never print a password
            return urlunsplit(parts._replace(netloc=netloc[0].split(":")[0] + ":***@" + netloc[1]))
        return self.url

    def _queries(self) -> dict[str, sql.Composed]:
        s = sql.Identifier(self.schema)

        def q(text: str) -> sql.Composed:
            return sql.SQL(text).format(s=s)

        return {
            "lock_head": q("SELECT seq, hash FROM {s}.head FOR UPDATE"),
            "head": q("SELECT seq FROM {s}.head"),
            "append": q(
                "SELECT duplicate, positions, version FROM {s}.append_batches("
                "%b::text[], %b::bigint[], %b::int[], %b::text[], %b::text[], %b::text[], %b::text[], "
                "%b::text[], %b::text[], %b::text[], %b::text[], %b::text[])"
            ),
            "insert": q(f"INSERT INTO {{s}}.events ({COLUMNS}) SELECT * FROM unnest("
                        + ", ".join(f"%s::{t}" for t in ARRAY_TYPES.split(", ")) + ")"),
            "move_head": q("UPDATE {s}.head SET seq = %s, hash = %s"),
            "page": q(f"SELECT {COLUMNS} FROM {{s}}.events WHERE seq > %s AND seq <= %s ORDER BY seq LIMIT %s"),
            "fold_page": q(
                "SELECT seq, stream, version, type, time, data FROM {s}.events "
                "WHERE seq > %s AND seq <= %s ORDER BY seq LIMIT %s"
            ),
            "count_since": q("SELECT count(*) FROM {s}.events WHERE seq > %s"),
            "stream": q(f"SELECT {COLUMNS} FROM {{s}}.events WHERE stream = %s AND version > %s ORDER BY version"),
            "event": q(f"SELECT {COLUMNS} FROM {{s}}.events WHERE id = %s"),
            "version": q("SELECT version FROM {s}.events WHERE stream = %s ORDER BY version DESC LIMIT 1"),
            "streams": q(
                "WITH RECURSIVE s(stream) AS ("
                " SELECT min(stream) FROM {s}.events"
                " UNION ALL SELECT (SELECT min(stream) FROM {s}.events WHERE stream > s.stream)"
                " FROM s WHERE s.stream IS NOT NULL)"
                " SELECT stream FROM s WHERE stream IS NOT NULL"
            ),
            "at_time": q("SELECT max(seq) FROM {s}.events WHERE time <= %s"),
            "save_snapshot": q(
                "INSERT INTO {s}.snapshots (name, code_version, position, state) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (name, code_version, position) DO UPDATE SET state = excluded.state"
            ),
            "prune_snapshots": q(
                "DELETE FROM {s}.snapshots WHERE name = %s AND position NOT IN "
                "(SELECT position FROM {s}.snapshots WHERE name = %s ORDER BY position DESC LIMIT 3)"
            ),
            "load_snapshot": q(
                "SELECT position, state FROM {s}.snapshots WHERE name = %s AND code_version = %s "
                "AND position <= %s ORDER BY position DESC LIMIT 1"
            ),
            "get_cursor": q("SELECT position FROM {s}.cursors WHERE name = %s"),
            "set_cursor": q(
                "INSERT INTO {s}.cursors (name, position) VALUES (%s, %s) ON CONFLICT (name) "
                "DO UPDATE SET position = GREATEST({s}.cursors.position, excluded.position)"
            ),
        }

    # -- set-up ---------------------------------------------------------------------------
    def _init_schema(self, create: bool) -> None:
        s = sql.Identifier(self.schema)
        conn = self._conn
        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f'"{self.schema}".meta',)
        ).fetchone()[0]
        if exists:
            row = conn.execute(sql.SQL("SELECT value FROM {s}.meta WHERE key = 'format'").format(s=s)).fetchone()
            if row is not None:
                check_format(row[0], self._safe_url())
                return
        if not create:
            raise StoreError(
                f"no ledger in schema {self.schema!r} at {self._safe_url()}",
                hint="check --store / LEDGER_STORE, or create it with a writing command",
            )
        ddl = SCHEMA_DDL.format(s=s.as_string(conn), genesis=GENESIS_HASH, channel=sql.Literal(self.channel).as_string(conn))
        role = ROLE_DDL.format(
            s=s.as_string(conn), role=sql.Literal(WRITER_ROLE).as_string(conn),
            role_id=sql.Identifier(WRITER_ROLE).as_string(conn),
        )
        try:
            with conn.transaction():
                # Two processes creating the same ledger at once take turns.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"tpu-ledger schema {self.schema}",))
                conn.execute(ddl)
                conn.execute(
                    sql.SQL("INSERT INTO {s}.meta (key, value) VALUES ('format', %s) ON CONFLICT DO NOTHING").format(s=s),
                    (str(FORMAT_VERSION),),
                )
            with conn.transaction():
                conn.execute(role)
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot create the ledger schema {self.schema!r} at {self._safe_url()}: {exc}",
                hint="the user needs CREATE on the database (or create the schema once as its owner)",
            ) from exc

    # -- writing --------------------------------------------------------------------------
    def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int | None = None
    ) -> AppendResult:
        return self.append_many([(stream, events, expected_version)])[0]

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
        encoded: dict[int, tuple[object, str]] = {}  # writers reuse one actor dict: encode it once
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
                cached = encoded.get(id(new.actor))
                if cached is None or cached[0] is not new.actor:
                    cached = encoded[id(new.actor)] = (new.actor, dumps(new.actor))
                actor = cached[1]
                data = dumps(new.data)
                ids.append(id_)
                keyed.append(id_ if new.key is not None else None)
                types.append(new.type)
                times.append(time_)
                actors.append(actor)
                causations.append(new.causation)
                datas.append(data)
                # canonical(envelope) around prev_hash, seq and version; see append_batches.
                pre, post = body_around(stream, new.type, time_, actor, id_, new.causation, data)
                pres.append(pre)
                posts.append(post)
            if len(set(ids[first:])) != len(ids) - first:
                raise UsageError(f"a batch for stream {stream!r} repeats an idempotency key")
        with self._lock:
            try:
                rows = self._conn.execute(self._q["append"], (streams, expected, counts, *cols)).fetchall()
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
                if isinstance(exc, psycopg.errors.UniqueViolation):
                    raise StoreError(
                        f"append refused by {self._safe_url()}: {exc.diag.message_primary}",
                        hint="two events of one call share an idempotency key",
                    ) from exc
                raise StoreError(f"append to {self._safe_url()} failed: {exc}", hint="nothing was stored; retry") from exc
        return [AppendResult(tuple(positions), version, duplicate) for duplicate, positions, version in rows]

    def import_events(self, events: Sequence[Event]) -> None:
        if not events:
            return
        q = self._q
        with self._lock, self._write_errors():
            conn = self._conn
            with conn.transaction():
                seq, prev_hash = conn.execute(q["lock_head"]).fetchone()
                cols = _columns(events)
                for i, ev in enumerate(events):
                    body = body_text(*(col[i] for col in cols[:10]))
                    if ev.seq != seq + 1 or ev.prev_hash != prev_hash or row_hash(ev.prev_hash, body) != ev.hash:
                        raise StoreError(f"event seq {ev.seq} does not continue the chain at seq {seq}")
                    seq, prev_hash = ev.seq, ev.hash
                with conn.pipeline():
                    conn.execute(q["insert"], cols)
                    conn.execute(q["move_head"], (seq, prev_hash))

    def _write_errors(self):
        store = self

        class _Errors:
            def __enter__(self) -> None:
                return None

            def __exit__(self, exc_type, exc, tb) -> bool:
                if exc is None or not isinstance(exc, psycopg.Error):
                    return False
                if isinstance(exc, psycopg.errors.UniqueViolation):
                    raise StoreError(
                        f"append refused by {store._safe_url()}: {exc.diag.message_primary}",
                        hint="two events of one call share an idempotency key",
                    ) from exc
                raise StoreError(f"append to {store._safe_url()} failed: {exc}", hint="retry; the append was rolled back") from exc

        return _Errors()

    # -- reading --------------------------------------------------------------------------
    def read_all(self, after: int = 0, limit: int | None = None) -> Iterator[Event]:
        for rows in self._pages(self._q["page"], after, None, limit):
            yield from map(_row_to_event, rows)

    def raw_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        """Undecoded rows (COLUMNS order; actor and data as the stored canonical JSON text) in
        seq order: `events.body_text(*row[:10])` rebuilds the hashed bytes."""
        for rows in self._pages(self._q["page"], after, until, None):
            yield from rows

    def fold_rows(self, after: int = 0, until: int | None = None) -> Iterator[tuple]:
        """(seq, stream, version, type, time, data JSON text) in seq order: what the fold reads."""
        for rows in self._pages(self._q["fold_page"], after, until, None):
            yield from rows

    def count_since(self, after: int) -> int:
        with self._lock:
            return self._conn.execute(self._q["count_since"], (after,)).fetchone()[0]

    def _pages(self, query: sql.Composed, after: int, until: int | None, limit: int | None) -> Iterator[list[tuple]]:
        # Keyset pages, each its own snapshot: safe because seq order is commit order, so a
        # later page can hold nothing that belonged before an earlier one.
        until = until if until is not None else 2**62
        left = limit if limit is not None else -1
        while left != 0:
            size = PAGE if left < 0 else min(PAGE, left)
            with self._lock:
                rows = self._conn.execute(query, (after, until, size)).fetchall()
            if not rows:
                return
            yield rows
            after = rows[-1][0]
            if left > 0:
                left -= len(rows)
            if len(rows) < size:
                return

    def read_stream(self, stream: str, after_version: int = 0) -> list[Event]:
        with self._lock:
            rows = self._conn.execute(self._q["stream"], (stream, after_version)).fetchall()
        return [_row_to_event(r) for r in rows]

    def get_event(self, event_id: str) -> Event | None:
        with self._lock:
            row = self._conn.execute(self._q["event"], (event_id,)).fetchone()
        return _row_to_event(row) if row else None

    def head(self) -> int:
        with self._lock:
            return self._conn.execute(self._q["head"]).fetchone()[0]

    def stream_version(self, stream: str) -> int:
        with self._lock:
            row = self._conn.execute(self._q["version"], (stream,)).fetchone()
        return row[0] if row else 0

    def streams(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute(self._q["streams"])]

    def position_at_time(self, iso_time: str) -> int:
        with self._lock:
            row = self._conn.execute(self._q["at_time"], (iso_time,)).fetchone()
        return row[0] or 0

    # -- snapshots and cursors ------------------------------------------------------------
    def save_snapshot(self, snapshot: Snapshot) -> None:
        with self._lock, self._conn.transaction():
            self._conn.execute(
                self._q["save_snapshot"], (snapshot.name, snapshot.code_version, snapshot.position, snapshot.state)
            )
            # Keep the newest few per name: older ones only cost space.
            self._conn.execute(self._q["prune_snapshots"], (snapshot.name, snapshot.name))

    def load_snapshot(self, name: str, code_version: str, at_most: int | None = None) -> Snapshot | None:
        with self._lock:
            row = self._conn.execute(
                self._q["load_snapshot"], (name, code_version, at_most if at_most is not None else 2**62)
            ).fetchone()
        return Snapshot(name, code_version, row[0], bytes(row[1])) if row else None

    def get_cursor(self, name: str) -> int:
        with self._lock:
            row = self._conn.execute(self._q["get_cursor"], (name,)).fetchone()
        return row[0] if row else 0

    def set_cursor(self, name: str, position: int) -> None:
        with self._lock:
            self._conn.execute(self._q["set_cursor"], (name, position))

    # -- waiting --------------------------------------------------------------------------
    def wait_for_append(self, after: int, timeout: float) -> int:
        """Sleep on LISTEN until a commit moves the head past `after` (or timeout)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._listener is None:
                self._listener = self._connect()
                self._listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        # LISTEN is active before the head is read, so no commit can slip in unnoticed.
        while True:
            head = self.head()
            left = deadline - time.monotonic()
            if head > after or left <= 0:
                return head
            for _ in self._listener.notifies(timeout=left, stop_after=1):
                pass

    # -- leases (see ledger/store/leases.py) ----------------------------------------------
    def execute(self, query: sql.Composable | str, params: Sequence | None = None) -> list[tuple]:
        """Run one statement in its own transaction, `{s}` being the ledger schema; for the
        store's companions (leases), not for events."""
        if isinstance(query, str):
            query = sql.SQL(query).format(s=sql.Identifier(self.schema))
        with self._lock:
            cur = self._conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def acquire_lease(self, name: str, holder: str, ttl: float) -> bool:
        from ledger.store.leases import PostgresLeases

        return PostgresLeases(self).acquire(name, holder, ttl)

    def renew_lease(self, name: str, holder: str, ttl: float) -> bool:
        from ledger.store.leases import PostgresLeases

        return PostgresLeases(self).renew(name, holder, ttl)

    def release_lease(self, name: str, holder: str) -> bool:
        from ledger.store.leases import PostgresLeases

        return PostgresLeases(self).release(name, holder)

    def close(self) -> None:
        with self._lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            self._conn.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
