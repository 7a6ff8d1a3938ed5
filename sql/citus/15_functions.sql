-- Every function of schemas mailroom and mailroom_internal (the internals, migrations/0400-0401) on
-- every node (Citus creates mailroom_internal there with its owner, as a dependency). A statement
-- routed to a shard runs on a worker with the functions it names (the redaction trigger, _attempt_log in the reaper's
-- UPDATE, clock() in a routed WHERE), so they are Citus objects: created on the workers now,
-- and every later CREATE OR REPLACE of sql/ reaches them (db migrate sends each statement
-- alone on a coordinator). Only what depends on a table that stays on the coordinator cannot
-- be created there; nothing routed to a worker calls those (docs/scale.md).

DO $functions$
DECLARE
    v_fn regprocedure;
    v_message text;
BEGIN
    FOR v_fn IN
        SELECT p.oid::regprocedure
        FROM pg_catalog.pg_proc AS p
        WHERE
            p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)
            AND p.prokind IN ('f', 'p')
            AND NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_dist_object AS o
                WHERE o.classid = 'pg_catalog.pg_proc'::regclass AND o.objid = p.oid
            )
        ORDER BY p.oid
    LOOP
        BEGIN
            PERFORM create_distributed_function(v_fn);
        EXCEPTION
            -- The one refusal accepted: the function depends on an object Citus does not
            -- distribute (a coordinator-only table's row type), which create_distributed_function
            -- raises as 0A000 "… has dependency to … that is not in Citus' metadata" (Citus 13:
            -- DeferErrorIfHasUnsupportedDependency). It stays on the coordinator. An already
            -- distributed function is only a NOTICE (and skipped above); anything else is a failure.
            WHEN feature_not_supported THEN
                GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
                IF v_message NOT LIKE '%has dependency %' THEN
                    RAISE;
                END IF;
                RAISE DEBUG 'citus: % stays on the coordinator: %', v_fn, v_message;
        END;
    END LOOP;
END;
$functions$;
