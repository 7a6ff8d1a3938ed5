-- SMTP capture credentials (SMTP AUTH, docs/inboxes.md "SMTP AUTH"): `mailroom smtpcred create
-- --owner O` makes a username and a secret on the client, prints the secret once and hands only
-- its sha256 to create_smtp_credential; `inbox serve` does the same with the password of an AUTH
-- and asks smtp_login, the one function of mailroom_inbound here. A login grants one thing: every
-- message of the session is stored in the owner's capture inbox (owner type api), whatever its
-- recipients; the inbox is the credential's, kept open by its logins.
-- Errors: MR290 unknown, revoked or wrong credential, MR291 malformed digest, MR292 unknown
-- credential id, MR293 smtp.capture_plan names no plan, MR210 bad owner.

CREATE OR REPLACE FUNCTION mailroom_internal._smtp_capture(p_credential_id bigint)
RETURNS TABLE (capture_address text, expires_at timestamptz)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_cred mailroom.smtp_credentials;
    v_plan mailroom.plans;
    v_now timestamptz := mailroom.clock();
    v_until timestamptz;
    v_extended timestamptz;
    v_address text;
    v_id bigint;
    v_attempt integer := 0;
BEGIN
    -- The credential's capture inbox, open until now + its plan's max TTL: the open one extended
    -- (never shortened), else (none yet, expired, deleted or purged) a new one made and recorded.
    SELECT * INTO v_cred FROM mailroom.smtp_credentials AS c WHERE c.id = p_credential_id FOR UPDATE;
    SELECT * INTO v_plan FROM mailroom.plans AS p WHERE p.name = mailroom.setting('smtp.capture_plan');
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MR293', MESSAGE = 'the setting smtp.capture_plan names no plan';
    END IF;
    v_until := v_now + make_interval(mins => v_plan.max_ttl_minutes);
    IF v_cred.capture_mailbox_id IS NOT NULL THEN
        UPDATE mailroom.mailboxes AS m SET expires_at = greatest(m.expires_at, v_until)
        WHERE
            m.id = v_cred.capture_mailbox_id
            AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, v_now)
        RETURNING m.address, m.expires_at INTO v_address, v_extended;
        IF FOUND THEN
            capture_address := v_address;
            expires_at := v_extended;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    LOOP
        -- as create_mailbox: 80 random bits in the local part
        v_address := encode(mailroom_internal._random_bytes(10), 'hex') || '@'
            || lower(btrim(mailroom.setting('inbox.domain')));
        v_id := mailroom_internal._insert_mailbox(
            v_address, v_plan.name, 'api'::mailroom.mailbox_owner_type, v_cred.owner_id, null, v_until, v_now
        );
        EXIT WHEN v_id IS NOT NULL;
        v_attempt := v_attempt + 1;
        IF v_attempt >= 5 THEN
            RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'could not generate a unique mailbox address';
        END IF;
    END LOOP;
    UPDATE mailroom.smtp_credentials AS c SET capture_mailbox_id = v_id WHERE c.id = p_credential_id;
    capture_address := v_address;
    expires_at := v_until;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._smtp_capture(bigint) IS
'Internal: an SMTP credential''s capture inbox, open until now + its plan''s max TTL (extended, or made anew when closed); its address and expiry. Errors: MR293.';

CREATE OR REPLACE FUNCTION mailroom.create_smtp_credential(
    p_owner_id text,
    p_digest bytea,
    p_label text DEFAULT null
)
RETURNS TABLE (credential_id bigint, username text, capture_address text, expires_at timestamptz)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id bigint;
    v_username text;
BEGIN
    IF nullif(btrim(p_owner_id), '') IS NULL OR length(p_owner_id) > 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'MR210', MESSAGE = 'an SMTP credential needs an owner id (1 to 200 characters)';
    END IF;
    IF p_digest IS NULL OR octet_length(p_digest) <> 32 THEN
        RAISE EXCEPTION USING ERRCODE = 'MR291', MESSAGE = 'the digest must be 32 bytes (sha256 of the secret)';
    END IF;
    -- the username: 'smtp-' and 12 random hex digits (48 bits; the unique key refuses a repeat)
    v_username := 'smtp-' || encode(mailroom_internal._random_bytes(6), 'hex');
    INSERT INTO mailroom.smtp_credentials (owner_id, username, digest, label, created_at)
    VALUES (btrim(p_owner_id), v_username, p_digest, left(p_label, 200), mailroom.clock())
    RETURNING id INTO v_id;
    credential_id := v_id;
    username := v_username;
    SELECT c.capture_address, c.expires_at INTO capture_address, expires_at
    FROM mailroom_internal._smtp_capture(v_id) AS c;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.create_smtp_credential(text, bytea, text) IS
'Register an SMTP capture credential of an owner by its secret''s sha256 (the secret never comes here) and open its capture inbox; its id, username, capture address and expiry. Errors: MR291 digest not 32 bytes, MR210 bad owner, MR293.';

GRANT EXECUTE ON FUNCTION mailroom.create_smtp_credential(text, bytea, text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.smtp_login(p_username text, p_digest bytea)
RETURNS TABLE (credential_id bigint, capture_address text, expires_at timestamptz)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id bigint;
BEGIN
    -- one answer (MR290) for an unknown username, a wrong secret and a revoked credential
    SELECT c.id INTO v_id
    FROM mailroom.smtp_credentials AS c
    WHERE c.username = p_username AND c.digest = p_digest AND c.revoked_at IS NULL;
    IF v_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR290', MESSAGE = 'unknown, revoked or wrong SMTP credential';
    END IF;
    UPDATE mailroom.smtp_credentials AS c SET last_login_at = mailroom.clock() WHERE c.id = v_id;
    credential_id := v_id;
    SELECT c.capture_address, c.expires_at INTO capture_address, expires_at
    FROM mailroom_internal._smtp_capture(v_id) AS c;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.smtp_login(text, bytea) IS
'SMTP AUTH: check a username and its secret''s sha256; the credential id and its capture inbox (kept open: extended to its plan''s max TTL, made anew when closed), where the session''s messages go. Errors: MR290 unknown, revoked or wrong, MR293.';

GRANT EXECUTE ON FUNCTION mailroom.smtp_login(text, bytea) TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom.list_smtp_credentials(p_owner_id text DEFAULT null)
RETURNS TABLE (
    credential_id bigint,
    owner_id text,
    username text,
    label text,
    capture_address text,
    created_at timestamptz,
    last_login_at timestamptz,
    revoked_at timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT c.id, c.owner_id, c.username, c.label, m.address, c.created_at, c.last_login_at, c.revoked_at
    FROM mailroom.smtp_credentials AS c
    LEFT JOIN mailroom.mailboxes AS m ON m.id = c.capture_mailbox_id
    WHERE p_owner_id IS NULL OR c.owner_id = p_owner_id
    ORDER BY c.id;
END;
$$;

COMMENT ON FUNCTION mailroom.list_smtp_credentials(text) IS
'SMTP capture credentials (all, or one owner''s): id, owner, username, label, capture inbox, created, last login and revoked times; never a digest.';

GRANT EXECUTE ON FUNCTION mailroom.list_smtp_credentials(text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.revoke_smtp_credential(p_credential_id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailroom.smtp_credentials AS c WHERE c.id = p_credential_id) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR292',
            MESSAGE = format('no SMTP credential %s', coalesce(p_credential_id::text, 'NULL'));
    END IF;
    UPDATE mailroom.smtp_credentials AS c SET revoked_at = mailroom.clock()
    WHERE c.id = p_credential_id AND c.revoked_at IS NULL;
    RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION mailroom.revoke_smtp_credential(bigint) IS
'Revoke an SMTP capture credential at once (its next login is refused, MR290; a session logged in before keeps it until it ends); false if revoked already; MR292 if there is no such credential.';

GRANT EXECUTE ON FUNCTION mailroom.revoke_smtp_credential(bigint) TO mailroom_admin;
