-- The token signing keyring (mailroom.signing_keys, migration 0125): the active key signs, the
-- active and verify-only keys verify, retired keys are wiped. No runtime role reads the table
-- or passes a key: dequeue_tokens, claim_messages, consume_token and verify_token read it inside
-- their definer functions. Key management is mailroom_admin's (`mailroom keys …`, docs/accounts.md).

CREATE OR REPLACE FUNCTION mailroom_internal._key_fingerprint(p_key bytea)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the first 8 bytes of sha256(key), hex: what `mailroom keys list` shows, and what a command
    -- holding MAILROOM_SECRET_KEY computes on its side (the key itself never travels)
    SELECT encode(substr(mailroom_internal._digest(p_key, 'sha256'), 1, 8), 'hex');
$$;

COMMENT ON FUNCTION mailroom_internal._key_fingerprint(bytea) IS
'Internal: the fingerprint of a signing key, the first 8 bytes of sha256(key) in hex (NULL for NULL).';

CREATE OR REPLACE FUNCTION mailroom_internal._active_signing_key()
RETURNS bytea
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key bytea;
BEGIN
    SELECT k.key INTO v_key FROM mailroom.signing_keys AS k WHERE k.state = 'active';
    IF v_key IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR120',
            MESSAGE = 'the keyring has no active signing key',
            HINT = 'mailroom keys rotate (SELECT mailroom.rotate_signing_key()) makes one';
    END IF;
    RETURN v_key;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._active_signing_key() IS
'Internal: the active signing key of the keyring (MR120 when there is none).';

CREATE OR REPLACE FUNCTION mailroom_internal._verifying_keys(p_ids OUT integer[], p_keys OUT bytea[])
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the order a verifier tries them: the active key, then verify-only keys, newest first
    SELECT
        coalesce(array_agg(k.id ORDER BY k.state, k.created_at DESC, k.id DESC), '{}'),
        coalesce(array_agg(k.key ORDER BY k.state, k.created_at DESC, k.id DESC), '{}')
    FROM mailroom.signing_keys AS k
    WHERE k.state IN ('active', 'verify_only');
$$;

COMMENT ON FUNCTION mailroom_internal._verifying_keys() IS
'Internal: ids and keys that verify a signed value, in the order they are tried (active, then verify-only newest first).';

CREATE OR REPLACE FUNCTION mailroom_internal._lock_keyring()
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    -- EXCLUSIVE: key changes queue up one after the other, while plain reads (dequeue, claim,
    -- consume) go on. Only the owner can take it: no runtime role has a privilege on the table.
    LOCK TABLE mailroom.signing_keys IN EXCLUSIVE MODE;
$$;

COMMENT ON FUNCTION mailroom_internal._lock_keyring() IS
'Internal: serialize key changes (EXCLUSIVE lock on mailroom.signing_keys; readers are not blocked).';

CREATE OR REPLACE FUNCTION mailroom.rotate_signing_key()
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ts timestamptz := mailroom.clock();
    v_id integer;
BEGIN
    PERFORM mailroom_internal._lock_keyring();
    UPDATE mailroom.signing_keys AS k
    SET state = 'verify_only', state_changed_at = v_ts
    WHERE k.state = 'active';
    INSERT INTO mailroom.signing_keys AS k (key, state, origin, created_at, state_changed_at)
    VALUES (mailroom_internal._random_bytes(32), 'active', 'generated', v_ts, v_ts)
    RETURNING k.id INTO v_id;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom.rotate_signing_key() IS
'Make a new random active signing key; the previous active key becomes verify-only (its links keep working until it is retired). Returns the new key id.';

GRANT EXECUTE ON FUNCTION mailroom.rotate_signing_key() TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.retire_signing_key(p_id integer)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state mailroom.signing_key_state;
BEGIN
    PERFORM mailroom_internal._lock_keyring();
    SELECT k.state INTO v_state FROM mailroom.signing_keys AS k WHERE k.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MR121', MESSAGE = format('no signing key %s', coalesce(p_id::text, 'NULL'));
    END IF;
    IF v_state = 'active' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR122',
            MESSAGE = format('signing key %s is the active key: rotate first (mailroom keys rotate)', p_id);
    END IF;
    -- retiring twice changes nothing
    UPDATE mailroom.signing_keys AS k
    SET state = 'retired', key = NULL, state_changed_at = mailroom.clock()
    WHERE k.id = p_id AND k.state = 'verify_only';
END;
$$;

COMMENT ON FUNCTION mailroom.retire_signing_key(integer) IS
'Retire a verify-only signing key: links it signed stop verifying and its key bytes are wiped (MR121 unknown id, MR122 the active key).';

GRANT EXECUTE ON FUNCTION mailroom.retire_signing_key(integer) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.export_signing_key(p_id integer DEFAULT null)
RETURNS bytea
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id integer;
    v_key bytea;
BEGIN
    SELECT k.id, k.key INTO v_id, v_key
    FROM mailroom.signing_keys AS k
    WHERE (p_id IS NULL AND k.state = 'active') OR k.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MR121', MESSAGE = format('no signing key %s', coalesce(p_id::text, 'active'));
    END IF;
    IF v_key IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR123', MESSAGE = format('signing key %s is retired: its key bytes are gone', v_id);
    END IF;
    UPDATE mailroom.signing_keys AS k SET last_exported_at = mailroom.clock() WHERE k.id = v_id;
    RETURN v_key;
END;
$$;

COMMENT ON FUNCTION mailroom.export_signing_key(integer) IS
'The key bytes of a signing key (default: the active one), for a verifier outside the database; records last_exported_at '
'(MR121 unknown id, MR123 retired). A result, never a parameter: a server logging statements does not log it.';

GRANT EXECUTE ON FUNCTION mailroom.export_signing_key(integer) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.import_signing_key(p_key bytea, p_active boolean DEFAULT false)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ts timestamptz := mailroom.clock();
    v_id integer;
    v_state mailroom.signing_key_state;
BEGIN
    IF p_key IS NULL OR octet_length(p_key) < 32 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR120',
            MESSAGE = 'signing key missing or shorter than 32 bytes';
    END IF;
    PERFORM mailroom_internal._lock_keyring();
    -- importing the same key again finds it (the comparison is on the owner's side only)
    SELECT k.id, k.state INTO v_id, v_state
    FROM mailroom.signing_keys AS k
    WHERE k.key = p_key;
    IF v_id IS NULL THEN
        INSERT INTO mailroom.signing_keys AS k (key, state, origin, created_at, state_changed_at)
        VALUES (p_key, 'verify_only', 'imported', v_ts, v_ts)
        RETURNING k.id, k.state INTO v_id, v_state;
    END IF;
    IF p_active AND v_state <> 'active' THEN
        UPDATE mailroom.signing_keys AS k
        SET state = 'verify_only', state_changed_at = v_ts
        WHERE k.state = 'active';
        UPDATE mailroom.signing_keys AS k
        SET state = 'active', state_changed_at = v_ts
        WHERE k.id = v_id;
    END IF;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom.import_signing_key(bytea, boolean) IS
'Add an existing signing key (e.g. the MAILROOM_SECRET_KEY of an older release) to the keyring, verify-only so links '
'it signed keep working; p_active makes it the active key. Idempotent. The one call that carries a key: run it once. '
'Errors: MR120 key missing or shorter than 32 bytes.';

GRANT EXECUTE ON FUNCTION mailroom.import_signing_key(bytea, boolean) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.list_signing_keys()
RETURNS TABLE (
    id integer,
    state mailroom.signing_key_state,
    origin text,
    fingerprint text,
    created_at timestamptz,
    state_changed_at timestamptz,
    last_exported_at timestamptz
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- fingerprint: mailroom_internal._key_fingerprint, to match an exported key; NULL once retired
    SELECT
        k.id,
        k.state,
        k.origin,
        mailroom_internal._key_fingerprint(k.key),
        k.created_at,
        k.state_changed_at,
        k.last_exported_at
    FROM mailroom.signing_keys AS k
    ORDER BY k.id;
$$;

COMMENT ON FUNCTION mailroom.list_signing_keys() IS
'The keyring without its keys: id, state, origin, fingerprint (first 8 bytes of sha256(key)), times.';

GRANT EXECUTE ON FUNCTION mailroom.list_signing_keys() TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.signing_key_state_of(p_fingerprint text)
RETURNS mailroom.signing_key_state
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state mailroom.signing_key_state;
BEGIN
    -- Asked by a command that signs (collect, send) started with MAILROOM_SECRET_KEY: is the key it
    -- holds the one links are signed with? It sends the fingerprint, never the key, and learns the
    -- state of that one key only (listing the keyring is the admin's).
    IF p_fingerprint IS NULL OR p_fingerprint !~ '^[0-9a-f]{16}$' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'signing_key_state_of: the fingerprint must be 16 lowercase hex characters (sha256(key), first 8 bytes)';
    END IF;
    SELECT k.state INTO v_state
    FROM mailroom.signing_keys AS k
    WHERE k.key IS NOT NULL AND mailroom_internal._key_fingerprint(k.key) = p_fingerprint
    ORDER BY k.state
    LIMIT 1;
    RETURN v_state;
END;
$$;

COMMENT ON FUNCTION mailroom.signing_key_state_of(text) IS
'The state (active, verify_only) of the keyring''s key with this fingerprint (first 8 bytes of sha256(key), hex), NULL when '
'no live key has it: lets collect and send check MAILROOM_SECRET_KEY without the key travelling.';

GRANT EXECUTE ON FUNCTION mailroom.signing_key_state_of(text) TO mailroom_collector, mailroom_sender, mailroom_admin;
