-- API keys (owner type api): `mailroom apikey create OWNER` makes a key on the client, prints it
-- once and hands only its sha256 to create_api_key; the HTTP server does the same with the key a
-- request carries, and _api_key_owner decides. The key never reaches the database, a log or a dump.
-- Errors: MR241 unknown or revoked key, MR247 malformed digest, MR248 unknown key id, MR210 bad owner.

CREATE OR REPLACE FUNCTION mailroom_internal._api_key_owner(p_key_digest bytea)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owner text;
BEGIN
    -- NULL without a key (the caller may still hold a session token); the owner of a live key;
    -- else MR241, the same for an unknown and a revoked key
    IF p_key_digest IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT k.owner_id INTO v_owner
    FROM mailroom.api_keys AS k
    WHERE k.digest = p_key_digest AND k.revoked_at IS NULL;
    IF v_owner IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR241', MESSAGE = 'unknown or revoked API key';
    END IF;
    RETURN v_owner;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._api_key_owner(bytea) IS
'Internal: the owner id of a live API key by its sha256 digest; NULL for NULL; MR241 for an unknown or revoked key.';

CREATE OR REPLACE FUNCTION mailroom.create_api_key(
    p_owner_id text,
    p_key_digest bytea,
    p_label text DEFAULT null,
    p_hint text DEFAULT null
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF nullif(btrim(p_owner_id), '') IS NULL OR length(p_owner_id) > 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'MR210', MESSAGE = 'an API key needs an owner id (1 to 200 characters)';
    END IF;
    IF p_key_digest IS NULL OR octet_length(p_key_digest) <> 32 THEN
        RAISE EXCEPTION USING ERRCODE = 'MR247', MESSAGE = 'the key digest must be 32 bytes (sha256 of the key)';
    END IF;
    INSERT INTO mailroom.api_keys (owner_id, digest, label, hint, created_at)
    VALUES (btrim(p_owner_id), p_key_digest, left(p_label, 200), left(p_hint, 8), mailroom.clock())
    RETURNING id INTO v_id;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom.create_api_key(text, bytea, text, text) IS
'Register an API key of an owner by its sha256 digest (the key itself never comes here); returns its id. Errors: MR247 digest not 32 bytes, MR210 bad owner.';

GRANT EXECUTE ON FUNCTION mailroom.create_api_key(text, bytea, text, text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.list_api_keys(p_owner_id text DEFAULT null)
RETURNS TABLE (
    key_id bigint,
    owner_id text,
    label text,
    hint text,
    created_at timestamptz,
    revoked_at timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL: its body is not checked against tables at creation (sql/ also compiles before 0141)
    RETURN QUERY
    SELECT k.id, k.owner_id, k.label, k.hint, k.created_at, k.revoked_at
    FROM mailroom.api_keys AS k
    WHERE p_owner_id IS NULL OR k.owner_id = p_owner_id
    ORDER BY k.id;
END;
$$;

COMMENT ON FUNCTION mailroom.list_api_keys(text) IS
'API keys (all, or one owner''s): id, owner, label, the last 4 characters, created and revoked times; never a digest.';

GRANT EXECUTE ON FUNCTION mailroom.list_api_keys(text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.revoke_api_key(p_key_id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailroom.api_keys AS k WHERE k.id = p_key_id) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR248',
            MESSAGE = format('no API key %s', coalesce(p_key_id::text, 'NULL'));
    END IF;
    UPDATE mailroom.api_keys AS k SET revoked_at = mailroom.clock()
    WHERE k.id = p_key_id AND k.revoked_at IS NULL;
    RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION mailroom.revoke_api_key(bigint) IS
'Revoke an API key at once (its next request is refused, MR241; its webhook endpoints'' queued deliveries are not sent); false if it was revoked already; MR248 if there is no such key.';

GRANT EXECUTE ON FUNCTION mailroom.revoke_api_key(bigint) TO mailroom_admin;
