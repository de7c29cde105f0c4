-- The embedded ledger's tables (tpu-ledger format 4). Run in one transaction with
-- triggers.sql when a ledger is created; IF NOT EXISTS makes two creators at once harmless.
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    stream TEXT NOT NULL,
    version INTEGER NOT NULL,
    type TEXT NOT NULL,
    time TEXT NOT NULL,
    actor TEXT NOT NULL,
    id TEXT NOT NULL UNIQUE,
    causation TEXT,
    data TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    UNIQUE (stream, version)
);
-- No index on time: it would cost every append ~20%, and only `replay --until TIME` needs it
-- (a scan of a million rows in C takes a fraction of a second).
--
-- Snapshots are a cache of the fold, not part of the record: rows here may be replaced and
-- pruned. Each names the event it folds up to (position, event_hash) and hashes its own
-- content (hash), so a reader can check it against the chain before using it.
CREATE TABLE IF NOT EXISTS snapshots (
    name TEXT NOT NULL,
    code_version TEXT NOT NULL,
    position INTEGER NOT NULL,
    event_hash TEXT NOT NULL,
    state BLOB NOT NULL,
    hash TEXT NOT NULL,
    PRIMARY KEY (name, code_version, position)
);
CREATE TABLE IF NOT EXISTS cursors (name TEXT PRIMARY KEY, position INTEGER NOT NULL);
