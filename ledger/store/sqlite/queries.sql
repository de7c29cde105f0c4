-- The embedded ledger's statements, by name (ledger/store/sqlfiles.py reads them).

-- name: format
SELECT value FROM meta WHERE key = 'format';

-- name: set_format
INSERT INTO meta (key, value) VALUES ('format', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: tables
SELECT name FROM sqlite_master WHERE type = 'table';

-- Who still holds a lease (a running reconciler): `ledger upgrade` waits for none. Arg: now.
-- name: live_holders
SELECT DISTINCT holder FROM leases WHERE holder <> '' AND expires_at > ? ORDER BY holder;

-- == the log ==============================================================================
-- name: head_row
SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1;

-- name: head
SELECT MAX(seq) FROM events;

-- name: insert
INSERT INTO events (seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- Which of these ids (a JSON array) are stored, and where: one statement for any number.
-- name: stored_ids
SELECT id, seq FROM events WHERE id IN (SELECT value FROM json_each(?));

-- name: stream_version
SELECT MAX(version) FROM events WHERE stream = ?;

-- A negative LIMIT is no limit.
-- name: read_all
SELECT seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash
FROM events WHERE seq > ? ORDER BY seq LIMIT ?;

-- name: read_stream
SELECT seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash
FROM events WHERE stream = ? AND version > ? ORDER BY version;

-- name: get_event
SELECT seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash
FROM events WHERE id = ?;

-- name: hash_at
SELECT hash FROM events WHERE seq = ?;

-- name: streams
SELECT DISTINCT stream FROM events ORDER BY stream;

-- name: at_time
SELECT MAX(seq) FROM events WHERE time <= ?;

-- name: raw_rows
SELECT seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash
FROM events WHERE seq > ? AND seq <= ? ORDER BY seq;

-- What the fold needs, in replay order: data stays canonical JSON text until decoded.
-- name: fold_rows
SELECT seq, stream, version, type, time, data FROM events WHERE seq > ? AND seq <= ? ORDER BY seq;

-- name: stream_rows
SELECT seq, stream, version, type, time, data FROM events
WHERE stream IN (SELECT value FROM json_each(?1)) AND type IN (SELECT value FROM json_each(?2)) AND seq <= ?3
ORDER BY seq;

-- == snapshots ============================================================================
-- name: save_snapshot
INSERT INTO snapshots (name, code_version, position, event_hash, state, hash) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (name, code_version, position)
DO UPDATE SET event_hash = excluded.event_hash, state = excluded.state, hash = excluded.hash;

-- Keep the newest few per name: older ones only cost space.
-- name: prune_snapshots
DELETE FROM snapshots WHERE name = ?1 AND position NOT IN
    (SELECT position FROM snapshots WHERE name = ?1 ORDER BY position DESC LIMIT 3);

-- name: load_snapshot
SELECT name, code_version, position, event_hash, state, hash FROM snapshots
WHERE name = ? AND code_version = ? AND position <= ? ORDER BY position DESC LIMIT 1;

-- name: list_snapshots
SELECT name, code_version, position, event_hash, state, hash FROM snapshots
ORDER BY position, name, code_version;

-- name: delete_snapshot
DELETE FROM snapshots WHERE name = ? AND code_version = ? AND position = ?;

-- == cursors ==============================================================================
-- name: get_cursor
SELECT position FROM cursors WHERE name = ?;

-- name: set_cursor
INSERT INTO cursors (name, position) VALUES (?, ?)
ON CONFLICT (name) DO UPDATE SET position = MAX(position, excluded.position);
