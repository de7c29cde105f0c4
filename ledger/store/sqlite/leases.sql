-- Leases of the embedded ledger (see ledger/store/leases.py), in the ledger file, judged by
-- this host's clock (passed in as seconds since the epoch: one host by nature).

-- name: create
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL,
    token INTEGER NOT NULL
);

-- The token grows only when the lease changes hands. Args: name, holder, expires, now.
-- name: acquire
INSERT INTO leases (name, holder, expires_at, token) VALUES (?1, ?2, ?3, 1)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at,
    token = CASE WHEN leases.holder = excluded.holder THEN leases.token ELSE leases.token + 1 END
WHERE leases.holder = excluded.holder OR leases.expires_at <= ?4;

-- Args: expires, name, holder, now.
-- name: renew
UPDATE leases SET expires_at = ?1 WHERE name = ?2 AND holder = ?3 AND expires_at > ?4;

-- The row stays (holder '' and expired) so the next holder's token still grows.
-- Args: now, name, holder.
-- name: release
UPDATE leases SET holder = '', expires_at = ?1 WHERE name = ?2 AND holder = ?3;

-- name: get
SELECT name, holder, expires_at, token FROM leases WHERE name = ?;

-- name: all
SELECT name, holder, expires_at, token FROM leases ORDER BY name;
