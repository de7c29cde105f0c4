-- A role that can extend the ledger but never rewrite it ({role} its name as a literal,
-- {role_id} as an identifier, {s} the schema). Roles are cluster-wide; creating one needs
-- CREATEROLE, granting needs ownership: each step is skipped when not permitted.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {role}) THEN
        CREATE ROLE {role_id} NOLOGIN;
    END IF;
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
