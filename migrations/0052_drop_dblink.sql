-- mailroom:as-migrator
-- mailroom no longer uses dblink. Drop the extension where the role running the migrations owns
-- it (migration 0010 created it as that role); leave it, with a NOTICE, where another role owns
-- it, where this role may not drop it, or where other objects depend on it.

DO $dblink$
DECLARE
    v_owner text;
BEGIN
    SELECT e.extowner::pg_catalog.regrole::text INTO v_owner
    FROM pg_catalog.pg_extension AS e
    WHERE e.extname = 'dblink';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_owner <> current_user::text THEN
        RAISE NOTICE 'extension dblink is left installed: it belongs to %, not to %', v_owner, current_user;
        RETURN;
    END IF;
    BEGIN
        DROP EXTENSION IF EXISTS dblink RESTRICT;
    EXCEPTION
        WHEN insufficient_privilege OR dependent_objects_still_exist THEN
            RAISE NOTICE 'extension dblink is left installed: %', sqlerrm;
    END;
END;
$dblink$;
