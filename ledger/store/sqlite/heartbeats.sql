-- Heartbeats of the embedded ledger's services (see ledger/store/heartbeats.py), in the
-- ledger file, judged by this host's clock (seconds since the epoch, passed in). Not events:
-- a row per instance, updated in place; created where missing, so older code is unaffected.

-- name: create
CREATE TABLE IF NOT EXISTS heartbeats (
    instance TEXT PRIMARY KEY,
    component TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    version TEXT NOT NULL,
    started REAL NOT NULL,
    last_beat REAL NOT NULL,
    lease_held INTEGER,
    stopped REAL
);

-- Args: instance, component, host, pid, version, started, now, lease_held.
-- name: beat
INSERT INTO heartbeats (instance, component, host, pid, version, started, last_beat, lease_held, stopped)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL)
ON CONFLICT (instance) DO UPDATE SET last_beat = excluded.last_beat, lease_held = excluded.lease_held,
    version = excluded.version, stopped = NULL;

-- Args: now, instance.
-- name: stop
UPDATE heartbeats SET stopped = ?1, last_beat = ?1, lease_held = CASE WHEN lease_held IS NULL THEN NULL ELSE 0 END
WHERE instance = ?2;

-- Args: now.
-- name: all
SELECT instance, component, host, pid, version, started, last_beat, lease_held, stopped, ?1 - last_beat
FROM heartbeats ORDER BY last_beat DESC, instance;

-- Args: cutoff (seconds since the epoch).
-- name: forget
DELETE FROM heartbeats WHERE last_beat < ?1;
