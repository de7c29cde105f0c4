-- Leases of the shared ledger (see ledger/store/leases.py); the table is created with the
-- ledger (schema.sql). Expiry is judged by the server's clock: hosts' clocks may differ.

-- The token grows only when the lease changes hands.
-- name: acquire
INSERT INTO {s}.leases AS l (name, holder, expires_at, token)
VALUES (%(name)s, %(holder)s, clock_timestamp() + make_interval(secs => %(ttl)s), 1)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at,
    token = CASE WHEN l.holder = excluded.holder THEN l.token ELSE l.token + 1 END
WHERE l.holder = excluded.holder OR l.expires_at <= clock_timestamp()
RETURNING token;

-- name: renew
UPDATE {s}.leases SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
WHERE name = %(name)s AND holder = %(holder)s AND expires_at > clock_timestamp()
RETURNING token;

-- The row stays (holder '' and expired) so the next holder's token still grows.
-- name: release
UPDATE {s}.leases SET holder = '', expires_at = clock_timestamp()
WHERE name = %(name)s AND holder = %(holder)s
RETURNING token;

-- name: get
SELECT name, holder, extract(epoch FROM expires_at)::float8, token,
       holder <> '' AND expires_at > clock_timestamp()
FROM {s}.leases WHERE name = %(name)s;

-- name: all
SELECT name, holder, extract(epoch FROM expires_at)::float8, token,
       holder <> '' AND expires_at > clock_timestamp()
FROM {s}.leases ORDER BY name;
