-- The shared ledger's schema (tpu-ledger format 5); {s} is the quoted schema name. Every
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
-- An event's hash: prev_hash || its canonical body, the body spliced together from the
-- client's pre and post (cut out of ledger.events.body_text's own output by recorder.py)
-- around the parts only the server knows (prev_hash, seq, version), so the hash is byte for
-- byte what ledger.events computes (recorder.py checks this splice against body_text when it
-- is imported). SQL and STABLE: inlined into the statements that use it, never called.
CREATE OR REPLACE FUNCTION {s}.event_hash(prev text, pre text, seq bigint, post text, version bigint)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT encode(sha256(convert_to(prev || pre || prev || '","seq":' || seq || post || version || '}', 'UTF8')), 'hex')
$$;
-- One event on one stream, the common append (a reconciler's intent, a watcher's change):
-- scalar arguments and a statement each, which costs the server less than half of
-- append_batches' arrays for the same event. Same rules: lock the head, a keyed id stored
-- already returns its position (duplicate), an expected version that is not the stream's
-- is LDG01, and the NOTIFY of the new head goes with the commit.
CREATE OR REPLACE FUNCTION {s}.append_one(
    p_stream text, p_expected bigint, p_id text, p_type text, p_time text, p_actor text,
    p_causation text, p_data text, p_pre text, p_post text, p_keyed boolean,
    OUT r_duplicate boolean, OUT r_seq bigint, OUT r_version bigint)
LANGUAGE plpgsql AS $$
DECLARE
    h_seq bigint;
    h_hash text;
    n_hash text;
    v bigint;
BEGIN
    SELECT h.seq, h.hash INTO h_seq, h_hash FROM {s}.head h FOR UPDATE;
    SELECT e.version INTO v FROM {s}.events e WHERE e.stream = p_stream ORDER BY e.version DESC LIMIT 1;
    v := coalesce(v, 0);
    IF p_keyed THEN
        SELECT e.seq INTO r_seq FROM {s}.events e WHERE e.id = p_id;
        IF FOUND THEN
            r_duplicate := true;
            r_version := v;
            RETURN;
        END IF;
    END IF;
    IF p_expected IS NOT NULL AND p_expected <> v THEN
        RAISE EXCEPTION USING ERRCODE = 'LDG01', MESSAGE = p_stream, DETAIL = p_expected::text || ' ' || v::text;
    END IF;
    h_seq := h_seq + 1;
    v := v + 1;
    n_hash := {s}.event_hash(h_hash, p_pre, h_seq, p_post, v);
    INSERT INTO {s}.events (seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash)
    VALUES (h_seq, p_stream, v, p_type, p_time, p_actor, p_id, p_causation, p_data, h_hash, n_hash);
    UPDATE {s}.head SET seq = h_seq, hash = n_hash;
    PERFORM pg_notify({channel}, h_seq::text);
    r_duplicate := false;
    r_seq := h_seq;
    r_version := v;
END $$;
-- Any other append: several events, streams or both. p_keyed holds the ids of keyed events
-- (NULL for random ids, which cannot be retries). One round trip: lock the head, check
-- versions and ids, chain and insert in one INSERT, move the head and NOTIFY.
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
                h_hash := {s}.event_hash(h_hash, r.pre, h_seq, r.post, v);
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
        PERFORM pg_notify({channel}, h_seq::text);
    END IF;
END $$;
-- Even a writer that bypasses append_one/append_batches (psql, another tool) can only
-- extend the chain: each new row's seq - 1 exists and its hash is the new row's prev_hash,
-- and the stream's previous version exists at a lower seq. With the primary key, seq stays
-- 1..N. After the statement the events table holds the new rows too, so each new row is
-- checked by two index probes (scalar subqueries: an index probe each, whatever the planner
-- guesses about new_rows), whether its neighbour is stored or in the same batch: no sort,
-- which made this trigger cost a one-event append more than the insert itself.
CREATE OR REPLACE FUNCTION {s}.check_growth() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM new_rows n
        WHERE n.prev_hash IS DISTINCT FROM (CASE WHEN n.seq = 1 THEN repeat('0', 64)
                                            ELSE (SELECT p.hash FROM {s}.events p WHERE p.seq = n.seq - 1) END)
           OR (n.version > 1 AND coalesce((SELECT sv.seq FROM {s}.events sv
                                           WHERE sv.stream = n.stream AND sv.version = n.version - 1), n.seq) >= n.seq)
    ) THEN
        RAISE EXCEPTION 'the ledger only grows at its head: seq, version or prev_hash out of order'
            USING ERRCODE = 'LDG02';
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER events_grow_at_head AFTER INSERT ON {s}.events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {s}.check_growth();
