-- Issue 36, item 1: every internal function of schema mailroom (its name starts with `_`, or `trg_`
-- for a trigger function) moves to schema mailroom_internal (migrations/0400). ALTER ... SET SCHEMA
-- keeps each function's OID: triggers, column defaults and the callers' plans follow it. The sql/
-- pass that follows re-creates the same functions there in place (CREATE OR REPLACE FUNCTION
-- mailroom_internal._x), and new internals are written there.
--
-- As mailroom_owner, like the sql/ pass: on a Citus coordinator the move of a distributed function
-- reaches the workers over that user's connections, which the sql/ pass then uses too.
-- Generic on purpose: whatever internal function exists when it runs moves, whichever migration or
-- release created it (extensions' functions are left where they are).

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
