-- mailroom:as-migrator
-- The role of `mailroom http serve` (issue 24): the HTTP face of the inboxes. Like the other
-- runtime roles it is NOLOGIN, reaches the schema (USAGE) and may execute only the http_*
-- functions granted to it in sql/ (and deliver_ses_message, the SES hook's delivery through the
-- same guard as SMTP). Created here when missing, as 0050 creates the others; where the migrating
-- role may not create roles, a DBA creates it first (docs/security.md).

DO $role$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'mailroom_http') THEN
        BEGIN
            CREATE ROLE mailroom_http NOLOGIN;
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR002',
                    MESSAGE = format('role mailroom_http does not exist and %s may not create roles', current_user),
                    HINT = 'Run the migration as a role with CREATEROLE, or have a DBA create the '
                    || 'role first: CREATE ROLE mailroom_http NOLOGIN (docs/security.md).';
        END;
    END IF;
END;
$role$;

GRANT USAGE ON SCHEMA mailroom TO mailroom_http;
