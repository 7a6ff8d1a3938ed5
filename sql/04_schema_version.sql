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

CREATE OR REPLACE FUNCTION mailroom.upgrade_steps(p_key_fingerprint text DEFAULT null)
RETURNS TABLE (step text, command text, reason text)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_legacy bigint;
    v_key_state mailroom.signing_key_state;
BEGIN
    -- The one-time steps an upgrade from 0.1.x leaves to the operator, in the order to take them
    -- (`mailroom db migrate` prints them; docs/upgrading.md lists them). p_key_fingerprint: the
    -- fingerprint of the MAILROOM_SECRET_KEY the caller holds (sql/15_keyring.sql), if any.
    IF p_key_fingerprint IS NOT NULL THEN
        v_key_state := mailroom.signing_key_state_of(p_key_fingerprint);
        IF v_key_state IS DISTINCT FROM 'active' THEN
            step := 'signing-key';
            command := 'mailroom keys import --active';
            reason := format(
                'MAILROOM_SECRET_KEY is %s: links are signed with the keyring''s active key, so a verifier '
                'holding MAILROOM_SECRET_KEY fails new links, and collect and send refuse to start with it set; '
                'run the command with it set, or unset it everywhere',
                CASE WHEN v_key_state IS NULL THEN 'not in the keyring' ELSE 'a verify-only key of the keyring' END);
            RETURN NEXT;
        END IF;
    END IF;
    SELECT count(*) INTO v_legacy FROM mailroom.senders AS s WHERE s.smtp_password_encrypted IS NOT NULL;
    IF v_legacy > 0 AND NOT EXISTS (SELECT FROM mailroom.sender_keys AS k WHERE k.state = 'active') THEN
        step := 'sender-key';
        command := 'mailroom outbound sender-key init';
        reason := 'relay passwords are sealed for the sender keypair now, and there is none yet';
        RETURN NEXT;
    END IF;
    IF v_legacy > 0 THEN
        step := 'relay-passwords';
        command := 'mailroom outbound convert-passwords';
        reason := format(
            '%s relay password(s) are still encrypted with the previous release''s MAILROOM_ENCRYPTION_KEY: run the '
            'command once with it set, then restart the senders with MAILROOM_SENDER_KEY_FILE', v_legacy);
        RETURN NEXT;
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom.upgrade_steps(text) IS
'The one-time steps an upgrade leaves to the operator (step, command, reason), in order: a MAILROOM_SECRET_KEY '
'(by its fingerprint) that is not the active signing key, a missing sender key, relay passwords to convert.';

GRANT EXECUTE ON FUNCTION mailroom.upgrade_steps(text) TO mailroom_monitor, mailroom_admin;
