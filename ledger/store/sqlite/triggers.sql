-- What the database itself enforces on `events`, whoever writes (this code, the sqlite3
-- shell, another tool): rows are only ever added at the head of the chain, never changed,
-- never removed. Run when a ledger is created and when an older format is upgraded
-- (DROP + CREATE: the newest definition replaces the old one in the same transaction).
--
-- An insert must be the next seq, the stream's next version, chained to the head's hash,
-- under an id not stored yet. The id check is what makes INSERT OR REPLACE harmless:
-- REPLACE deletes the row it collides with *without* firing delete triggers (unless the
-- connection turned recursive_triggers on), so the collision is refused before it happens.
-- seq and (stream, version) cannot collide: both must be one past the stored maximum.
-- (The WHEN clause is what every append pays, about 1.3 us a lookup on top of 2.7 us for
-- running a trigger at all: format 4 reads the head row once, for its seq and its hash,
-- where format 3 looked up MAX(seq) and then the hash at seq - 1. The first event is
-- chained to the genesis hash and only into an empty table. The body only runs on a refusal.)
DROP TRIGGER IF EXISTS events_contiguous;
CREATE TRIGGER events_contiguous BEFORE INSERT ON events
WHEN CASE WHEN NEW.seq = 1
          THEN NEW.prev_hash IS NOT '0000000000000000000000000000000000000000000000000000000000000000' OR EXISTS (SELECT 1 FROM events)
          ELSE NOT EXISTS (SELECT 1 FROM (SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1) AS head
                           WHERE head.seq = NEW.seq - 1 AND head.hash = NEW.prev_hash) END
  OR NEW.version IS NOT (SELECT IFNULL(MAX(version), 0) + 1 FROM events WHERE stream = NEW.stream)
  OR EXISTS (SELECT 1 FROM events WHERE id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'the ledger is append-only: an event with this id is stored already (INSERT OR REPLACE would delete it)')
    WHERE EXISTS (SELECT 1 FROM events WHERE id = NEW.id);
    SELECT RAISE(ABORT, 'the ledger only grows at its head: seq, version or prev_hash out of order');
END;
-- UPDATE OR REPLACE and upserts (ON CONFLICT DO UPDATE) are updates: refused here first.
DROP TRIGGER IF EXISTS events_no_update;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only: events cannot be updated'); END;
-- A DELETE with triggers present is never run as a truncation: this fires for every row.
DROP TRIGGER IF EXISTS events_no_delete;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only: events cannot be deleted'); END;
