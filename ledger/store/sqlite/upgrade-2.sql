-- Format 2 -> 3, in the transaction that then runs schema.sql and triggers.sql.
-- Format-2 snapshots carry no event hash nor a hash of their own: they cannot be checked,
-- so they go (they are a cache; the next replay at the head saves a new one).
DROP TABLE IF EXISTS snapshots;
