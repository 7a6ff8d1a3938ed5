-- What the database has: the schema version and the migrations applied, for every runtime role.
-- `mailroom db status`, `mailroom doctor` and operators' dashboards compare it with the version
-- the installed driver expects (`mailroom --version`). The ledger itself,
-- mailroom.schema_migrations, stays the owner's: these functions return it and nothing else.

CREATE OR REPLACE FUNCTION mailroom.list_migrations()
RETURNS TABLE (version integer, name text, sha256 text, applied_at timestamptz)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT m.version, m.name, m.sha256, m.applied_at
    FROM mailroom.schema_migrations AS m
    ORDER BY m.version;
$$;

COMMENT ON FUNCTION mailroom.list_migrations() IS
'The migrations applied to this database (version, file name, sha256 of the file, when), in order.';

GRANT EXECUTE ON FUNCTION mailroom.list_migrations()
TO mailroom_app, mailroom_http, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_monitor, mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.schema_version()
RETURNS integer
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT max(m.version) FROM mailroom.schema_migrations AS m;
$$;

COMMENT ON FUNCTION mailroom.schema_version() IS
'The schema version of this database: the number of its last applied migration (mailroom --version prints the one a driver expects).';

GRANT EXECUTE ON FUNCTION mailroom.schema_version()
TO mailroom_app, mailroom_http, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_monitor, mailroom_admin;
