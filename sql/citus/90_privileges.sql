-- Least privilege on the workers too (docs/scale.md, "The operator's part"). The first install
-- runs migrations/ with DDL propagation off, so their REVOKEs from PUBLIC and mailroom_owner's
-- default privileges (migrations/0050) held on the coordinator only: the functions Citus then
-- created on the workers were executable by PUBLIC there. Each migrate makes the workers agree.

-- Every function of schemas mailroom and mailroom_internal closed to PUBLIC (as on the coordinator, where this changes
-- nothing): Citus sends a REVOKE on its functions to the workers, in this transaction.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA mailroom FROM public;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA mailroom_internal FROM public;

-- A function a later release creates on the workers starts closed, as on the coordinator. Citus
-- does not propagate default privileges, so they are set on each worker (pg_default_acl only:
-- nothing this migrate's own transaction holds on a worker).
DO $privileges$
DECLARE
    v_failed text;
BEGIN
    SELECT string_agg(format('%s:%s: %s', r.nodename, r.nodeport, r.result), '; ')
    INTO v_failed
    FROM run_command_on_workers(
        'ALTER DEFAULT PRIVILEGES FOR ROLE mailroom_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC'
    ) AS r
    WHERE NOT r.success;
    IF v_failed IS NOT NULL THEN
        RAISE EXCEPTION 'could not set the default privileges of mailroom_owner on the workers: %', v_failed;
    END IF;
END;
$privileges$;
