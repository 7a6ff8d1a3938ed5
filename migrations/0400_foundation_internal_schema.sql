-- mailroom:as-migrator
-- Issue 36, item 1: the internals out of the public API's way. This file makes schema
-- mailroom_internal; migrations/0401 moves every internal function (its name starts with `_`, or
-- `trg_` for a trigger function) there, so `\df mailroom.*` lists only what a runtime role may call.
--
-- The schema is mailroom_owner's and nobody else's: no USAGE for PUBLIC (a new schema grants it
-- nothing; said again below) nor for any runtime role. A runtime role reaches an internal only
-- through a SECURITY DEFINER function of mailroom, which runs as mailroom_owner
-- (docs/architecture.md, "Where internals live").
--
-- As the migrator (the role that owns the database: mailroom_owner may not create a schema).
-- On a Citus coordinator with workers the schema is made on the workers first, committed there by
-- run_command_on_workers (a worker refuses DDL it would propagate itself: propagation off there): what this migrate does next on the workers runs as mailroom_owner (0401,
-- the sql/ pass), over Citus connections of that user, which would not see a schema this
-- transaction made over the migrator's (an empty schema left behind by a failed migrate is harmless;
-- the next one finds it).

DO $workers$
DECLARE
    v_failed text;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_node') IS NULL THEN
        RETURN;  -- not Citus
    END IF;
    EXECUTE $sql$
        SELECT string_agg(format('%s:%s: %s', r.nodename, r.nodeport, r.result), '; ')
        FROM run_command_on_workers(
            'SET LOCAL citus.enable_ddl_propagation TO off; '
            'CREATE SCHEMA IF NOT EXISTS mailroom_internal AUTHORIZATION mailroom_owner'
        ) AS r
        WHERE NOT r.success
    $sql$ INTO v_failed;
    IF v_failed IS NOT NULL THEN
        RAISE EXCEPTION 'could not create schema mailroom_internal on the workers: %', v_failed;
    END IF;
END;
$workers$;

CREATE SCHEMA IF NOT EXISTS mailroom_internal AUTHORIZATION mailroom_owner;
ALTER SCHEMA mailroom_internal OWNER TO mailroom_owner;
REVOKE ALL ON SCHEMA mailroom_internal FROM public;
COMMENT ON SCHEMA mailroom_internal IS
'mailroom''s internal functions (_x, trg_x): owner only; the API a runtime role calls is schema mailroom';
