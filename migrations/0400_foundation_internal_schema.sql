-- mailroom:as-migrator
-- Issue 36, item 1: the internals out of the public API's way. Every internal function (its name
-- starts with `_`, or `trg_` for a trigger function) moves from schema mailroom to schema
-- mailroom_internal, so `\df mailroom.*` lists only what a runtime role may call. ALTER ... SET
-- SCHEMA keeps each function's OID: triggers, column defaults and the callers' plans follow it.
-- The sql/ pass that follows this migration re-creates the same functions there in place
-- (CREATE OR REPLACE FUNCTION mailroom_internal._x), and new internals are written there.
--
-- The schema is mailroom_owner's and nobody else's: no USAGE for PUBLIC (a new schema grants it
-- nothing; said again below) nor for any runtime role. A runtime role reaches an internal only
-- through a SECURITY DEFINER function of mailroom, which runs as mailroom_owner
-- (docs/architecture.md, "Where internals live").
--
-- As the migrator (the role that owns the database: mailroom_owner may not create a schema).
-- Generic on purpose: whatever internal function exists when it runs moves, whichever migration
-- or release created it (pgTAP's and other extensions' functions are left where they are).

CREATE SCHEMA IF NOT EXISTS mailroom_internal AUTHORIZATION mailroom_owner;
ALTER SCHEMA mailroom_internal OWNER TO mailroom_owner;
REVOKE ALL ON SCHEMA mailroom_internal FROM public;
COMMENT ON SCHEMA mailroom_internal IS
'mailroom''s internal functions (_x, trg_x): owner only; the API a runtime role calls is schema mailroom';

DO $move$
DECLARE
    v_fn regprocedure;
BEGIN
    FOR v_fn IN
        SELECT p.oid::regprocedure
        FROM pg_catalog.pg_proc AS p
        WHERE
            p.pronamespace = 'mailroom'::regnamespace
            AND p.proname ~ '^(_|trg_)'
            AND NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_depend AS d
                WHERE
                    d.classid = 'pg_catalog.pg_proc'::regclass
                    AND d.objid = p.oid
                    AND d.deptype = 'e'
            )
        ORDER BY p.oid
    LOOP
        EXECUTE format('ALTER ROUTINE %s SET SCHEMA mailroom_internal', v_fn);
    END LOOP;
END;
$move$;
