-- The shared ledger's schema (tpu-ledger format 4); {s} is the quoted schema name. Every
-- statement is idempotent (IF NOT EXISTS, CREATE OR REPLACE): it runs when a ledger is
-- created and again, whole, when an older format is upgraded. Text columns use the "C"
-- collation: byte order, as SQLite sorts, and ISO times compare as instants.
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
-- The last seq and hash: every writer locks this one row first (commit order = seq order).
CREATE TABLE IF NOT EXISTS {s}.head (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    seq bigint NOT NULL,
    hash text NOT NULL
);
INSERT INTO {s}.head (one, seq, hash) VALUES (true, 0, repeat('0', 64)) ON CONFLICT DO NOTHING;
-- Snapshots are a cache of the fold, not part of the record: rows here may be replaced and
-- pruned. Each names the event it folds up to (position, event_hash) and hashes its own
-- content (hash), so a reader can check it against the chain before using it.
CREATE TABLE IF NOT EXISTS {s}.snapshots (
    name text COLLATE "C" NOT NULL,
    code_version text COLLATE "C" NOT NULL,
    position bigint NOT NULL,
    event_hash text NOT NULL,
    state bytea NOT NULL,
    hash text NOT NULL,
    PRIMARY KEY (name, code_version, position)
);
CREATE TABLE IF NOT EXISTS {s}.cursors (name text COLLATE "C" PRIMARY KEY, position bigint NOT NULL);
-- Leases (ledger/store/postgres/leases.sql) are created with the ledger: a connection in the
-- writer role may use them but not create them.
CREATE TABLE IF NOT EXISTS {s}.leases (
    name text COLLATE "C" PRIMARY KEY,
    holder text NOT NULL,
    expires_at timestamptz NOT NULL,
    token bigint NOT NULL
);
-- Append-only, whoever writes: UPDATE (so also INSERT ... ON CONFLICT DO UPDATE and MERGE's
-- UPDATE), DELETE (MERGE's DELETE too) and TRUNCATE are refused. PostgreSQL has no silent
-- REPLACE: a conflicting insert either fails or takes one of those refused paths.
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
-- The canonical JSON around seq, version and prev_hash comes from the client (pre/post, cut
-- out of ledger.events.body_text's own output by recorder.py), so the server only splices
-- numbers and the previous hash into it and the hash is byte for byte what ledger.events
-- computes (recorder.py checks the splice below against body_text when it is imported).
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
    a_seq bigint[] := '{}';
    a_stream text[] := '{}';
    a_ver bigint[] := '{}';
    a_prev text[] := '{}';
    a_hash text[] := '{}';
    touched text[] := '{}';
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
            seqs := '{}';
            FOR r IN SELECT x.pre, x.post FROM unnest(p_pre[off + 1 : off + n], p_post[off + 1 : off + n])
                    AS x(pre, post) LOOP
                h_seq := h_seq + 1;
                v := v + 1;
                a_prev := array_append(a_prev, h_hash);
                h_hash := encode(sha256(convert_to(
                    h_hash || r.pre || h_hash || '","seq":' || h_seq || r.post || v || '}', 'UTF8')), 'hex');
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
                WHEN n.seq = 1 THEN n.prev_hash <> repeat('0', 64)
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
    -- The channel is `<schema>_appended`: PgDatabase.channel LISTENs on it.
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_appended', NEW.seq::text);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER head_notify AFTER UPDATE ON {s}.head
    FOR EACH ROW WHEN (NEW.seq > OLD.seq) EXECUTE FUNCTION {s}.notify_append();
