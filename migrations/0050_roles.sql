-- Roles and ownership: mailroom_owner owns every object in schema mailroom (nothing logs in
-- as it), and one group role per runtime job holds EXECUTE on that job's functions only.
-- Grants of EXECUTE live next to each function in sql/; this file creates the roles, hands
-- the objects created so far to mailroom_owner and closes everything to PUBLIC.
--
-- Who may run it: a role that owns the database and has CREATEROLE (what managed PostgreSQL
-- gives its admin user), or any role that owns the database when a DBA created the roles
-- beforehand and granted mailroom_owner to it (docs/security.md).

DO $roles$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY[
        'mailroom_owner', 'mailroom_app', 'mailroom_collector', 'mailroom_sender',
        'mailroom_inbound', 'mailroom_monitor', 'mailroom_admin', 'mailroom_timekeeper'
    ] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r WHERE r.rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION
                WHEN insufficient_privilege THEN
                    RAISE EXCEPTION USING
                        ERRCODE = 'MR002',
                        MESSAGE = format('role %s does not exist and %s may not create roles', v_role, current_user),
                        HINT = 'Run the migration as a role with CREATEROLE, or have a DBA create the '
                        || 'mailroom_* roles first (docs/security.md).';
            END;
        END IF;
    END LOOP;
    IF NOT pg_catalog.pg_has_role(current_user, 'mailroom_owner', 'MEMBER') THEN
        BEGIN
            EXECUTE format('GRANT mailroom_owner TO %I', current_user);
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR002',
                    MESSAGE = format('%s is not a member of mailroom_owner and may not grant it', current_user),
                    HINT = 'GRANT mailroom_owner TO the role that runs the migrations.';
        END;
    END IF;
    IF NOT pg_catalog.pg_has_role('mailroom_admin', 'mailroom_monitor', 'MEMBER') THEN
        GRANT mailroom_monitor TO mailroom_admin;
    END IF;
END;
$roles$;

-- Hand every object created so far to mailroom_owner. Later migrations and the sql/ pass run
-- under SET ROLE mailroom_owner, so what they create is the owner's from the start.
DO $adopt$
DECLARE
    v_obj record;
BEGIN
    EXECUTE 'ALTER SCHEMA mailroom OWNER TO mailroom_owner';
    FOR v_obj IN
        SELECT
            CASE c.relkind
                WHEN 'v' THEN 'VIEW'
                WHEN 'm' THEN 'MATERIALIZED VIEW'
                WHEN 'S' THEN 'SEQUENCE'
                ELSE 'TABLE'
            END AS kind,
            c.oid::pg_catalog.regclass::text AS name
        FROM pg_catalog.pg_class AS c
        WHERE
            c.relnamespace = 'mailroom'::pg_catalog.regnamespace
            AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
            -- identity and serial sequences follow their table
            AND NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_depend AS d
                WHERE
                    d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                    AND d.objid = c.oid
                    AND d.deptype IN ('a', 'i')
            )
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO mailroom_owner', v_obj.kind, v_obj.name);
    END LOOP;
    FOR v_obj IN
        SELECT
            CASE p.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END AS kind,
            p.oid::pg_catalog.regprocedure::text AS name
        FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = 'mailroom'::pg_catalog.regnamespace
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO mailroom_owner', v_obj.kind, v_obj.name);
    END LOOP;
    FOR v_obj IN
        SELECT t.oid::pg_catalog.regtype::text AS name
        FROM pg_catalog.pg_type AS t
        WHERE
            t.typnamespace = 'mailroom'::pg_catalog.regnamespace
            AND t.typtype IN ('e', 'd', 'c')
            AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_catalog.pg_class AS c WHERE c.oid = t.typrelid) = 'c')
            AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type AS e WHERE e.typarray = t.oid)
    LOOP
        EXECUTE format('ALTER TYPE %s OWNER TO mailroom_owner', v_obj.name);
    END LOOP;
END;
$adopt$;

-- Nothing in schema mailroom is reachable by PUBLIC: functions created from now on by the
-- owner start closed too (global default privileges: a per-schema default cannot revoke).
REVOKE ALL ON SCHEMA mailroom FROM public;
REVOKE ALL ON ALL TABLES IN SCHEMA mailroom FROM public;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA mailroom FROM public;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA mailroom FROM public;
REVOKE ALL ON ALL PROCEDURES IN SCHEMA mailroom FROM public;
ALTER DEFAULT PRIVILEGES FOR ROLE mailroom_owner REVOKE EXECUTE ON FUNCTIONS FROM public;

-- Every runtime role reaches the schema (to call its functions), and nothing else in it.
GRANT USAGE ON SCHEMA mailroom TO
mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_monitor, mailroom_admin;
