-- Heartbeats of the shared ledger's services (see ledger/store/heartbeats.py), judged by the
-- server's clock (hosts' clocks may differ). Not events: a row per instance, updated in
-- place; the table is created where missing, so older code and the store format are unaffected.

-- name: create
CREATE TABLE IF NOT EXISTS {s}.heartbeats (
    instance text COLLATE "C" PRIMARY KEY,
    component text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    started timestamptz NOT NULL,
    last_beat timestamptz NOT NULL,
    lease_held boolean,
    stopped timestamptz
);

-- Whether the table is there already (a role that may not create it can still beat).
-- name: exists
SELECT to_regclass(%(table)s) IS NOT NULL;

-- name: beat
INSERT INTO {s}.heartbeats AS h (instance, component, host, pid, version, started, last_beat, lease_held, stopped)
VALUES (%(instance)s, %(component)s, %(host)s, %(pid)s, %(version)s, to_timestamp(%(started)s), clock_timestamp(),
        %(lease_held)s, NULL)
ON CONFLICT (instance) DO UPDATE SET last_beat = excluded.last_beat, lease_held = excluded.lease_held,
    version = excluded.version, stopped = NULL;

-- name: stop
UPDATE {s}.heartbeats SET stopped = clock_timestamp(), last_beat = clock_timestamp(),
    lease_held = CASE WHEN lease_held IS NULL THEN NULL ELSE false END
WHERE instance = %(instance)s;

-- name: all
SELECT instance, component, host, pid, version, extract(epoch FROM started)::float8,
       extract(epoch FROM last_beat)::float8, lease_held, extract(epoch FROM stopped)::float8,
       extract(epoch FROM clock_timestamp() - last_beat)::float8
FROM {s}.heartbeats ORDER BY last_beat DESC, instance;

-- name: forget
DELETE FROM {s}.heartbeats WHERE last_beat < clock_timestamp() - make_interval(secs => %(older_than)s)
RETURNING instance;

-- Whoever creates the table grants it as roles.sql grants the ledger's tables (which ran
-- before this table existed): the writer beats, the reader reads. Skipped when not permitted.
-- {role}/{reader} are the roles' names as literals, {role_id}/{reader_id} as identifiers.
-- name: grant
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = {role}) THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.heartbeats TO {role_id};
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = {reader}) THEN
        GRANT SELECT ON {s}.heartbeats TO {reader_id};
    END IF;
EXCEPTION WHEN insufficient_privilege THEN NULL;
END $$;
