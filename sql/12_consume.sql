-- Verifying and consuming signed token values.

CREATE OR REPLACE FUNCTION mailroom_internal._ct_equal(p_a bytea, p_b bytea)
RETURNS boolean
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Double-HMAC comparison under a fresh random key: the time taken does
    -- not depend on where the two values first differ.
    SELECT p_a IS NOT NULL AND p_b IS NOT NULL
        AND mailroom_internal._hmac(p_a, k.key, 'sha256') = mailroom_internal._hmac(p_b, k.key, 'sha256')
    FROM (SELECT mailroom_internal._random_bytes(32) AS key) AS k;
$$;

COMMENT ON FUNCTION mailroom_internal._ct_equal(bytea, bytea) IS
'Internal: constant-time equality of two byte strings (double HMAC under a random key).';

CREATE OR REPLACE FUNCTION mailroom_internal._mac_key_index(
    p_keys bytea[], p_action mailroom.token_action, p_secret bytea, p_code text, p_mac bytea
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_found integer;
BEGIN
    IF (mailroom_internal._token_action(p_action)).with_code AND (p_code IS NULL OR p_code !~ '^[0-9]{5}$') THEN
        RETURN NULL;
    END IF;
    -- every key is tried, so the time does not reveal which one matched
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        IF mailroom_internal._ct_equal(p_mac, mailroom_internal._token_mac(p_action, p_secret, p_code, p_keys[i]))
            AND v_found IS NULL THEN
            v_found := i;
        END IF;
    END LOOP;
    RETURN v_found;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._mac_key_index(bytea[], mailroom.token_action, bytea, text, bytea) IS
'Internal: 1-based index of the first key whose HMAC matches, or NULL.';

CREATE OR REPLACE FUNCTION mailroom_internal._signing_keys(p_key bytea, p_previous_keys bytea[])
RETURNS bytea[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_keys bytea [] := ARRAY[p_key] || coalesce(p_previous_keys, '{}');
BEGIN
    FOR i IN 1 .. array_length(v_keys, 1) LOOP
        PERFORM mailroom_internal._check_key(v_keys[i]);
    END LOOP;
    RETURN v_keys;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._signing_keys(bytea, bytea[]) IS
'Internal: current key followed by previous keys, each checked (MR120).';

CREATE OR REPLACE FUNCTION mailroom_internal._split_signed(p_signed text)
RETURNS bytea
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_raw bytea := mailroom_internal._b64url_decode(p_signed);
BEGIN
    IF v_raw IS NULL OR octet_length(v_raw) <> 64 OR mailroom_internal._b64url_encode(v_raw) <> p_signed THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR110',
            MESSAGE = 'malformed token: expected 86 characters of URL-safe base64 without padding';
    END IF;
    RETURN v_raw;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._split_signed(text) IS
'Internal: decode a signed value to its 64 bytes (secret || mac), MR110 when malformed.';

CREATE OR REPLACE FUNCTION mailroom_internal._verify_token(p_signed text, p_code text, p_keys bytea[])
RETURNS TABLE (valid boolean, action mailroom.token_action, key_index integer)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_raw bytea := mailroom_internal._b64url_decode(p_signed);
    v_secret bytea;
    v_mac bytea;
    v_match record;
BEGIN
    IF v_raw IS NULL OR octet_length(v_raw) <> 64 THEN
        RETURN QUERY SELECT false, NULL::mailroom.token_action, NULL::integer;
        RETURN;
    END IF;
    v_secret := substr(v_raw, 1, 32);
    v_mac := substr(v_raw, 33, 32);
    -- every type is tried (the time does not tell which matched); the first that matches, in
    -- mailroom.token_actions' order
    SELECT m.action, m.key_index INTO v_match
    FROM (
        SELECT
            a.action,
            a.output_code,
            mailroom_internal._mac_key_index(p_keys, a.action, v_secret, CASE WHEN a.with_code THEN p_code END, v_mac)
                AS key_index
        FROM mailroom.token_actions AS a
    ) AS m
    WHERE m.key_index IS NOT NULL
    ORDER BY m.output_code
    LIMIT 1;
    IF v_match.action IS NOT NULL THEN
        RETURN QUERY SELECT true, v_match.action, v_match.key_index;
    ELSE
        RETURN QUERY SELECT false, NULL::mailroom.token_action, NULL::integer;
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._verify_token(text, text, bytea[]) IS
'Internal: (valid, action, 1-based index of the matching key of p_keys); constant-time over every key.';

CREATE OR REPLACE FUNCTION mailroom.verify_token(p_signed text, p_code text DEFAULT null)
RETURNS TABLE (valid boolean, action mailroom.token_action, key_id integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ring record := mailroom_internal._verifying_keys();
BEGIN
    RETURN QUERY
    SELECT v.valid, v.action, v_ring.p_ids[v.key_index]
    FROM mailroom_internal._verify_token(p_signed, p_code, v_ring.p_keys) AS v;
END;
$$;

COMMENT ON FUNCTION mailroom.verify_token(text, text) IS
'Check a signed value against the keyring without touching tokens: (valid, action, key_id of the matching key); '
'constant-time, tries the active key then the verify-only ones; p_code needed for recovery.';

GRANT EXECUTE ON FUNCTION mailroom.verify_token(text, text) TO mailroom_app;

-- The keyed form of the previous release, for one release: the passed keys are tried first (their
-- index, as before), then the keyring (key_index 0).
CREATE OR REPLACE FUNCTION mailroom.verify_token(
    p_signed text,
    p_key bytea,
    p_code text DEFAULT null,
    p_previous_keys bytea[] DEFAULT '{}'
)
RETURNS TABLE (valid boolean, action mailroom.token_action, key_index integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_keys bytea [] := mailroom_internal._signing_keys(p_key, p_previous_keys);
    v_passed integer := cardinality(v_keys);
BEGIN
    RETURN QUERY
    SELECT v.valid, v.action, CASE WHEN v.key_index > v_passed THEN 0 ELSE v.key_index END
    FROM mailroom_internal._verify_token(p_signed, p_code, v_keys || (mailroom_internal._verifying_keys()).p_keys) AS v;
END;
$$;

COMMENT ON FUNCTION mailroom.verify_token(text, bytea, text, bytea[]) IS
'Deprecated since 0.2.0, removed in 0.3.0: verify_token(p_signed, p_code) that also tries the passed keys (key_index: theirs, 0 for the keyring).';

GRANT EXECUTE ON FUNCTION mailroom.verify_token(text, bytea, text, bytea[]) TO mailroom_app;

-- The form of the previous release (its _consume_token, still running in a session during an
-- upgrade, calls it): the two-argument form below, the account looked up. Deprecated since 0.2.0, removed in 0.3.0.
CREATE OR REPLACE FUNCTION mailroom_internal._raise_token_state(p_token bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM mailroom_internal._raise_token_state((SELECT tk.account FROM mailroom.tokens AS tk WHERE tk.id = p_token), p_token);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._raise_token_state(bigint) IS
'Internal, deprecated since 0.2.0, removed in 0.3.0 (for the previous release''s _consume_token during an upgrade): raise MR112/MR114/MR117/MR113 when a token is unknown, used, revoked or expired.';

-- The same by the token's account and id: the read names the account (on Citus, tokens are
-- distributed by account, so it runs on one shard instead of every one).
CREATE OR REPLACE FUNCTION mailroom_internal._raise_token_state(p_account bigint, p_token bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t mailroom.tokens;
BEGIN
    SELECT * INTO t FROM mailroom.tokens AS tk WHERE tk.account = p_account AND tk.id = p_token;
    PERFORM mailroom_internal._raise_token_row_state(t);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._raise_token_state(bigint, bigint) IS
'Internal: raise MR112/MR114/MR117/MR113 when the token (by account and id) is unknown, used, revoked or expired.';

-- The one rule for a token's state, on a row already read: the caller that holds the row locked
-- (_consume_token) asks it without reading the row again (on Citus a round trip to the worker).
CREATE OR REPLACE FUNCTION mailroom_internal._raise_token_row_state(t mailroom.tokens)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF t.id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR112', MESSAGE = 'unknown token';
    ELSIF t.consumed_at IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR114', MESSAGE = 'token already used';
    ELSIF t.expires_at <= mailroom.clock() THEN
        RAISE EXCEPTION USING ERRCODE = 'MR113', MESSAGE = 'token expired';
    ELSIF t.revoked_at IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR117', MESSAGE = 'token revoked: a newer token of the same kind was issued';
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._raise_token_row_state(mailroom.tokens) IS
'Internal: raise MR112/MR114/MR117/MR113 when a token row is missing (NULL id), used, revoked or expired.';

-- The token a link's secret names, by the secret's digest (a seam: on Citus, where tokens are
-- distributed by account, sql/citus/13 finds the account through the lookup table token_digests
-- first, so the read runs on one shard).
-- Its Citus form: sql/citus/13_token_digests.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._token_by_digest(p_digest bytea)
RETURNS TABLE (token_account bigint, token_id bigint, token_action mailroom.token_action)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tk.account, tk.id, tk.action FROM mailroom.tokens AS tk WHERE tk.secret_digest = p_digest;
$$;

COMMENT ON FUNCTION mailroom_internal._token_by_digest(bytea) IS
'Internal: (account, id, action) of the token whose secret_digest is p_digest; no row when none.';


-- Using a token. Every failure raises its own MRnnn error and changes nothing, except a wrong
-- recovery code: that is a result row (outcome 'wrong_code'), so the attempt it counted commits
-- with the caller's transaction like any other write. Each recovery token accepts
-- tokens.max_code_attempts codes (the right one included); once they are used up the token is
-- locked (MR116) whatever code comes next. Codes and MACs are compared in constant time.
CREATE OR REPLACE FUNCTION mailroom_internal._consume_token(p_signed text, p_code text, p_keys bytea[])
RETURNS TABLE (account bigint, outcome text, attempts_left integer)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_keys bytea [] := p_keys;
    v_raw bytea := mailroom_internal._split_signed(p_signed);
    v_secret bytea := substr(v_raw, 1, 32);
    v_mac bytea := substr(v_raw, 33, 32);
    v_max integer := mailroom.setting('tokens.max_code_attempts')::integer;
    v_ts timestamptz := mailroom.clock();
    t mailroom.tokens;
    v_type record;
    v_status mailroom.account_status;
    v_locked record;  -- the account's status and the token's row, locked together
    v_attempts integer;
BEGIN
    SELECT f.token_account, f.token_id, f.token_action INTO t.account, t.id, t.action
    FROM mailroom_internal._token_by_digest(mailroom_internal._digest(v_secret, 'sha256')) AS f;
    IF NOT FOUND THEN
        -- a genuine value the database no longer knows, or a forgery?
        IF (SELECT v.valid FROM mailroom_internal._verify_token(p_signed, p_code, v_keys) AS v) THEN
            RAISE EXCEPTION USING ERRCODE = 'MR112', MESSAGE = 'unknown token';
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'MR111', MESSAGE = 'bad token signature';
    END IF;
    SELECT * INTO v_type FROM mailroom_internal._token_action(t.action);

    -- a type without a code is signed over its path and secret only: check that now (a type with a
    -- code is checked once the code has been counted, below)
    IF NOT v_type.with_code
        AND mailroom_internal._mac_key_index(v_keys, t.action, v_secret, NULL, v_mac) IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR111', MESSAGE = 'bad token signature';
    END IF;

    -- Lock order: the account, then the token (suspend_account locks the account), so a
    -- concurrent suspend either commits first (then the status check below refuses) or waits
    -- until this token is used. FOR NO KEY UPDATE: a token insert's foreign-key check
    -- (FOR KEY SHARE) on the account does not wait for it, so a reissue cannot deadlock with us.
    -- Both rows in one statement, locked in that order (the account's row mark first); the token row
    -- is locked from here on: its state and attempt count cannot change under us. By account too: on
    -- Citus the two are co-located and the statement is one round trip to the account's shard (it was
    -- two, issue 46). A token's account always exists (tokens_account_fkey, ON DELETE CASCADE): no row
    -- means the token is gone, which _raise_token_row_state says.
    SELECT a.status, tk AS token INTO v_locked
    FROM mailroom.accounts AS a
    INNER JOIN mailroom.tokens AS tk ON a.id = tk.account
    WHERE a.id = t.account AND tk.account = t.account AND tk.id = t.id
    FOR NO KEY UPDATE OF a FOR UPDATE OF tk;
    v_status := v_locked.status;
    t := v_locked.token;
    -- its state, from the row just locked (not read again: issue 46, one round trip less on Citus)
    PERFORM mailroom_internal._raise_token_row_state(t);

    IF NOT mailroom_internal._token_eligible(t.action, v_status) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR118',
            MESSAGE = format('account %s is %s: its %s token cannot be used',
                t.account, coalesce(v_status::text, 'missing'), t.action);
    END IF;

    IF v_type.with_code THEN
        IF p_code IS NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR119', MESSAGE = format('a %s token needs its 5-digit code', replace(t.action::text, '_', '-'));
        END IF;
        IF t.code_attempts >= v_max THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR116',
                MESSAGE = format('token locked after %s wrong codes', v_max);
        END IF;
        -- every compared code counts, the right one too
        UPDATE mailroom.tokens AS tk
        SET code_attempts = tk.code_attempts + 1
        WHERE tk.account = t.account AND tk.id = t.id
        RETURNING tk.code_attempts INTO v_attempts;
        IF NOT mailroom_internal._ct_equal(
            mailroom_internal._digest(v_secret || convert_to(p_code, 'UTF8'), 'sha256'), t.code_digest
        ) THEN
            RETURN QUERY SELECT NULL::bigint, 'wrong_code'::text, greatest(v_max - v_attempts, 0);
            RETURN;
        END IF;
        IF mailroom_internal._mac_key_index(v_keys, t.action, v_secret, p_code, v_mac) IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'MR111', MESSAGE = 'bad token signature';
        END IF;
    END IF;

    -- single use: the row is locked and its state was checked above
    UPDATE mailroom.tokens AS tk
    SET consumed_at = v_ts
    WHERE tk.account = t.account AND tk.id = t.id
        AND tk.consumed_at IS NULL
        AND tk.revoked_at IS NULL
        AND tk.expires_at > v_ts;
    IF NOT FOUND THEN
        PERFORM mailroom_internal._raise_token_state(t.account, t.id);
        RAISE EXCEPTION USING ERRCODE = 'MR114', MESSAGE = 'token already used';
    END IF;
    PERFORM mailroom_internal._after_consume(t.account, t.action);
    RETURN QUERY SELECT
        t.account,
        'consumed'::text,
        CASE WHEN v_type.with_code THEN greatest(v_max - v_attempts, 0) END;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._consume_token(text, text, bytea[]) IS
'Internal: consume_token verifying the MAC against p_keys.';

-- Its Citus form: sql/citus/12_accounts.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._after_consume(p_account bigint, p_action mailroom.token_action)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- What a consumed token does to its account beyond the token row: on one node the trigger
    -- after_token_consumed activates a provisioned account (sql/11); on Citus that trigger cannot
    -- run (the token's row is on a worker), and sql/citus/12 overrides this to do it.
    -- _consume_token calls it once the token is consumed.
    PERFORM p_account, p_action;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._after_consume(bigint, mailroom.token_action) IS
'Internal: the account side of a consumed token (nothing on one node, where a trigger does it; Citus: the activation).';

CREATE OR REPLACE FUNCTION mailroom.consume_token(p_signed text, p_code text DEFAULT null)
RETURNS TABLE (account bigint, outcome text, attempts_left integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM mailroom_internal._consume_token(p_signed, p_code, (mailroom_internal._verifying_keys()).p_keys);
END;
$$;

COMMENT ON FUNCTION mailroom.consume_token(text, text) IS
'Use a signed token once: checks its signature against the keyring (active, then verify-only keys), state, code (recovery: tokens.max_code_attempts tries), account status. '
'One row (account, outcome, attempts_left): outcome consumed (account set), or wrong_code (account NULL; commit it, the attempt counts). '
'Every other failure raises MR110-MR120.';

GRANT EXECUTE ON FUNCTION mailroom.consume_token(text, text) TO mailroom_app;

-- The keyed form of the previous release, for one release: an application not restarted yet
-- keeps working; the passed keys are tried after the keyring (links an older collector signed
-- with them keep working before `mailroom keys import`).
CREATE OR REPLACE FUNCTION mailroom.consume_token(
    p_signed text,
    p_key bytea,
    p_code text DEFAULT null,
    p_previous_keys bytea[] DEFAULT '{}'
)
RETURNS TABLE (account bigint, outcome text, attempts_left integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM mailroom_internal._consume_token(
        p_signed, p_code, (mailroom_internal._verifying_keys()).p_keys || mailroom_internal._signing_keys(p_key, p_previous_keys)
    );
END;
$$;

COMMENT ON FUNCTION mailroom.consume_token(text, bytea, text, bytea[]) IS
'Deprecated since 0.2.0, removed in 0.3.0: consume_token(p_signed, p_code) that also accepts links signed with the passed keys.';

GRANT EXECUTE ON FUNCTION mailroom.consume_token(text, bytea, text, bytea[]) TO mailroom_app;
