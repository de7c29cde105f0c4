-- Two roles: one that can extend the ledger but never rewrite it ({role} its name as a
-- literal, {role_id} as an identifier), one that reads and changes nothing ({reader},
-- {reader_id}); {s} is the schema. Roles are cluster-wide; creating one needs CREATEROLE,
-- granting needs ownership: each step is skipped when not permitted.
DO $$
DECLARE
    wanted text;
BEGIN
    FOREACH wanted IN ARRAY ARRAY[{role}, {reader}] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = wanted) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', wanted);
        END IF;
    END LOOP;
EXCEPTION WHEN duplicate_object OR unique_violation OR insufficient_privilege THEN NULL;
END $$;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = {role}) THEN
        GRANT USAGE ON SCHEMA {s} TO {role_id};
        GRANT SELECT ON {s}.meta TO {role_id};
        GRANT SELECT, INSERT ON {s}.events TO {role_id};
        GRANT SELECT, UPDATE ON {s}.head TO {role_id};
        GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.snapshots TO {role_id};
        GRANT SELECT, INSERT, UPDATE ON {s}.cursors TO {role_id};
        GRANT SELECT, INSERT, UPDATE ON {s}.leases TO {role_id};
    END IF;
EXCEPTION WHEN insufficient_privilege THEN NULL;
END $$;
-- The reader: the dashboard, `ledger inspect`, `verify`, auditors. Granted on every table of
-- the schema, so a table a later format adds is covered when this file runs again at the upgrade.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = {reader}) THEN
        GRANT USAGE ON SCHEMA {s} TO {reader_id};
        GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {reader_id};
    END IF;
EXCEPTION WHEN insufficient_privilege THEN NULL;
END $$;
