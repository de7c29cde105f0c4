-- The shared ledger's statements, by name (ledger/store/sqlfiles.py reads them); {s} is the
-- quoted schema name.

-- name: format
SELECT value FROM {s}.meta WHERE key = 'format';

-- name: set_format
INSERT INTO {s}.meta (key, value) VALUES ('format', %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- Two processes creating or upgrading the same ledger at once take turns.
-- Who still holds a lease (a running reconciler): `ledger upgrade` waits for none.
-- name: live_holders
SELECT DISTINCT holder FROM {s}.leases WHERE holder <> '' AND expires_at > clock_timestamp() ORDER BY holder;

-- name: schema_lock
SELECT pg_advisory_xact_lock(hashtext(%s));

-- name: exists
SELECT to_regclass(%s) IS NOT NULL;

-- == the log ==============================================================================
-- name: lock_head
SELECT seq, hash FROM {s}.head FOR UPDATE;

-- name: head
SELECT seq FROM {s}.head;

-- name: analyze
ANALYZE {s}.events;

-- One event on one stream: scalar arguments (schema.sql, append_one).
-- name: append_one
SELECT r_duplicate, r_seq, r_version FROM {s}.append_one(
    %s::text, %s::bigint, %s::text, %s::text, %s::text, %s::text, %s::text, %s::text, %s::text, %s::text, %s::boolean);

-- name: append
SELECT duplicate, positions, version FROM {s}.append_batches(
    %b::text[], %b::bigint[], %b::int[], %b::text[], %b::text[], %b::text[], %b::text[],
    %b::text[], %b::text[], %b::text[], %b::text[], %b::text[]);

-- Sealed envelopes (import), one statement per batch: column arrays zipped by unnest.
-- name: insert
INSERT INTO {s}.events (seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash)
SELECT * FROM unnest(%s::bigint[], %s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[],
                     %s::text[], %s::text[], %s::text[], %s::text[], %s::text[]);

-- name: move_head
UPDATE {s}.head SET seq = %s, hash = %s;

-- name: notify_head
SELECT pg_notify({channel}, %s::text);

-- Keyset pages in seq order.
-- name: page
SELECT seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash
FROM {s}.events WHERE seq > %s AND seq <= %s ORDER BY seq LIMIT %s;

-- name: fold_page
SELECT seq, stream, version, type, time, data FROM {s}.events
WHERE seq > %s AND seq <= %s ORDER BY seq LIMIT %s;

-- name: stream_rows
SELECT seq, stream, version, type, time, data FROM {s}.events
WHERE stream = ANY(%s) AND type = ANY(%s) AND seq <= %s ORDER BY seq;

-- name: stream
SELECT seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash
FROM {s}.events WHERE stream = %s AND version > %s ORDER BY version;

-- name: event
SELECT seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash
FROM {s}.events WHERE id = %s;

-- name: hash_at
SELECT hash FROM {s}.events WHERE seq = %s;

-- name: version
SELECT version FROM {s}.events WHERE stream = %s ORDER BY version DESC LIMIT 1;

-- Distinct streams by skipping through the (stream, version) index: one probe per stream.
-- name: streams
WITH RECURSIVE s(stream) AS (
    SELECT min(stream) FROM {s}.events
    UNION ALL SELECT (SELECT min(stream) FROM {s}.events WHERE stream > s.stream) FROM s WHERE s.stream IS NOT NULL
)
SELECT stream FROM s WHERE stream IS NOT NULL;

-- name: at_time
SELECT max(seq) FROM {s}.events WHERE time <= %s;

-- == snapshots ============================================================================
-- name: save_snapshot
INSERT INTO {s}.snapshots (name, code_version, position, event_hash, state, hash) VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (name, code_version, position)
DO UPDATE SET event_hash = excluded.event_hash, state = excluded.state, hash = excluded.hash;

-- Keep the newest few per name: older ones only cost space.
-- name: prune_snapshots
DELETE FROM {s}.snapshots WHERE name = %(name)s AND position NOT IN
    (SELECT position FROM {s}.snapshots WHERE name = %(name)s ORDER BY position DESC LIMIT 3);

-- name: load_snapshot
SELECT name, code_version, position, event_hash, state, hash FROM {s}.snapshots
WHERE name = %s AND code_version = %s AND position <= %s ORDER BY position DESC LIMIT 1;

-- name: list_snapshots
SELECT name, code_version, position, event_hash, state, hash FROM {s}.snapshots
ORDER BY position, name, code_version;

-- name: delete_snapshot
DELETE FROM {s}.snapshots WHERE name = %s AND code_version = %s AND position = %s;

-- == cursors ==============================================================================
-- name: get_cursor
SELECT position FROM {s}.cursors WHERE name = %s;

-- name: set_cursor
INSERT INTO {s}.cursors (name, position) VALUES (%s, %s) ON CONFLICT (name)
DO UPDATE SET position = GREATEST({s}.cursors.position, excluded.position);
