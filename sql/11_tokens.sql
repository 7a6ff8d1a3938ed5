-- Tokens: CSPRNG codes, signed values, lifecycle triggers, statement-level
-- NOTIFY and the exactly-once dequeue.

CREATE OR REPLACE FUNCTION mailroom_internal._random_code()
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b bytea;
    v integer;
BEGIN
    -- Rejection sampling over 24 random bits: 16700000 = 167 * 100000 is the
    -- largest multiple of 10^5 below 2^24, so v % 100000 is uniform.
    LOOP
        b := mailroom_internal._random_bytes(3);
        v := (get_byte(b, 0) << 16) | (get_byte(b, 1) << 8) | get_byte(b, 2);
        IF v < 16700000 THEN
            RETURN lpad((v % 100000)::text, 5, '0');
        END IF;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._random_code() IS
'Internal: a uniformly distributed 5-digit code from pgcrypto''s CSPRNG.';

CREATE OR REPLACE FUNCTION mailroom_internal._b64url_encode_many(p_data bytea[])
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
STRICT
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL, not SQL: a SQL function with SET is planned again at every call, this query's plan
    -- is kept for the session (once a dequeued batch). replace(), not translate(): translate()
    -- takes its character-by-character path in a UTF-8 database (~20 us a signed value, ~4 us)
    RETURN (
        SELECT coalesce(array_agg(
            replace(replace(replace(replace(encode(u.d, 'base64'), E'\n', ''), '=', ''), '+', '-'), '/', '_')
            ORDER BY u.n
        ), '{}')
        FROM unnest(p_data) WITH ORDINALITY AS u (d, n)
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._b64url_encode_many(bytea[]) IS
'Internal: URL-safe base64 without padding (RFC 4648 section 5) of every element, same order.';

CREATE OR REPLACE FUNCTION mailroom_internal._b64url_encode(p_data bytea)
RETURNS text
LANGUAGE sql
IMMUTABLE
STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (mailroom_internal._b64url_encode_many(ARRAY[p_data]))[1];
$$;

COMMENT ON FUNCTION mailroom_internal._b64url_encode(bytea) IS
'Internal: URL-safe base64 without padding (RFC 4648 section 5).';

CREATE OR REPLACE FUNCTION mailroom_internal._b64url_decode(p_text text)
RETURNS bytea
LANGUAGE plpgsql
IMMUTABLE
STRICT
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_text !~ '^[A-Za-z0-9_-]*$' OR length(p_text) % 4 = 1 THEN
        RETURN NULL;
    END IF;
    RETURN decode(translate(p_text, '-_', '+/') || repeat('=', (4 - length(p_text) % 4) % 4), 'base64');
EXCEPTION
    WHEN invalid_parameter_value THEN
        RETURN NULL;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._b64url_decode(text) IS
'Internal: decode URL-safe base64 without padding; NULL when the text is not valid.';

CREATE OR REPLACE FUNCTION mailroom_internal._check_key(p_key bytea)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_key IS NULL OR octet_length(p_key) < 32 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR120',
            MESSAGE = 'signing key missing or shorter than 32 bytes';
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._check_key(bytea) IS
'Internal: raise MR120 unless the signing key is at least 32 bytes.';

-- The token types are rows of mailroom.token_actions (migration 0113): every rule that depends on a
-- token's type reads its row through _token_action, which refuses a type without one (MR125).
CREATE OR REPLACE FUNCTION mailroom_internal._token_action(
    p_action mailroom.token_action,
    OUT signing_path text,
    OUT eligible_status mailroom.account_status,
    OUT with_code boolean,
    OUT activates_account boolean,
    OUT output_code smallint
)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT a.signing_path, a.eligible_status, a.with_code, a.activates_account, a.output_code
    INTO signing_path, eligible_status, with_code, activates_account, output_code
    FROM mailroom.token_actions AS a
    WHERE a.action = p_action;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR125',
            MESSAGE = format('unknown token action %s: no row in mailroom.token_actions', coalesce(p_action::text, 'NULL'));
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._token_action(mailroom.token_action) IS
'Internal: the mailroom.token_actions row of a token type; MR125 when it has none (an unknown type is refused, never defaulted).';

CREATE OR REPLACE FUNCTION mailroom.token_actions()
RETURNS TABLE (
    action mailroom.token_action,
    signing_path text,
    eligible_status mailroom.account_status,
    with_code boolean,
    activates_account boolean,
    output_code smallint
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT a.action, a.signing_path, a.eligible_status, a.with_code, a.activates_account, a.output_code
    FROM mailroom.token_actions AS a
    ORDER BY a.output_code;
END;
$$;

COMMENT ON FUNCTION mailroom.token_actions() IS
'The token types: signature path, the account status a token needs, whether it carries a code, whether consuming it activates the account, the CSV action code.';

GRANT EXECUTE ON FUNCTION mailroom.token_actions() TO mailroom_app, mailroom_collector;

-- The MAC and the signed value are defined once, for arrays: dequeue_tokens signs a whole batch
-- in one call (a per-row chain of SQL functions cost ~25 us a token, the HMAC itself ~4 us).
-- What is signed is the type's path || secret, and the code after it for a type with a code.
CREATE OR REPLACE FUNCTION mailroom_internal._token_macs(
    p_actions mailroom.token_action[], p_secrets bytea[], p_codes text[], p_key bytea
)
RETURNS bytea[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- one check a batch: a type without its row is refused (MR125), never signed like another
    PERFORM mailroom_internal._token_action(u.action)
    FROM (SELECT DISTINCT x.action FROM unnest(p_actions) AS x (action)) AS u;
    RETURN mailroom_internal._hmac_many(
        ARRAY(
            SELECT
                convert_to(a.signing_path, 'UTF8') || u.secret
                || CASE WHEN a.with_code THEN convert_to(u.code, 'UTF8') ELSE ''::bytea END
            FROM unnest(p_actions, p_secrets, p_codes) WITH ORDINALITY AS u (action, secret, code, n)
            INNER JOIN mailroom.token_actions AS a ON u.action = a.action
            ORDER BY u.n
        ),
        p_key,
        'sha256'
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._token_macs(mailroom.token_action[], bytea[], text[], bytea) IS
'Internal: _token_mac of every element of the arrays (same order), in one call.';

CREATE OR REPLACE FUNCTION mailroom_internal._token_mac(
    p_action mailroom.token_action, p_secret bytea, p_code text, p_key bytea
)
RETURNS bytea
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (mailroom_internal._token_macs(ARRAY[p_action], ARRAY[p_secret], ARRAY[p_code], p_key))[1];
$$;

COMMENT ON FUNCTION mailroom_internal._token_mac(mailroom.token_action, bytea, text, bytea) IS
'Internal: HMAC-SHA256(key, path || secret [|| code]); the path and whether the code is appended are the type''s (mailroom.token_actions).';

CREATE OR REPLACE FUNCTION mailroom_internal._signed_values(
    p_actions mailroom.token_action[], p_secrets bytea[], p_codes text[], p_key bytea
)
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL (its query planned once a session; a SQL function with SET is planned at every call,
    -- a fixed cost of each dequeued batch)
    RETURN mailroom_internal._b64url_encode_many(
        ARRAY(
            SELECT u.secret || u.mac
            FROM unnest(p_secrets, mailroom_internal._token_macs(p_actions, p_secrets, p_codes, p_key))
                WITH ORDINALITY AS u (secret, mac, n)
            ORDER BY u.n
        )
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._signed_values(mailroom.token_action[], bytea[], text[], bytea) IS
'Internal: the signed link value of every token of the arrays (same order): base64url-nopad(secret || _token_mac).';

-- One value, in PL/pgSQL (compiled once a session): the array forms above are SQL functions that
-- are planned again at every call (~3.7 ms for a one-element call), fine once per dequeued batch,
-- too slow once per claimed token email. The same layout; pgTAP 11 checks both against the vectors.
CREATE OR REPLACE FUNCTION mailroom_internal._signed_value(
    p_action mailroom.token_action, p_secret bytea, p_code text, p_key bytea
)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_type record;
BEGIN
    -- the type's row (issue 36: the signed path and the code were a CASE here, so a new type would
    -- have been signed as a recovery); a type without its row is refused, MR125
    v_type := mailroom_internal._token_action(p_action);
    RETURN replace(replace(replace(replace(encode(p_secret || mailroom_internal._hmac(
        convert_to(v_type.signing_path, 'UTF8') || p_secret
        || CASE WHEN v_type.with_code THEN convert_to(p_code, 'UTF8') ELSE ''::bytea END,
        p_key, 'sha256'
    ), 'base64'), E'\n', ''), '=', ''), '+', '-'), '/', '_');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._signed_value(mailroom.token_action, bytea, text, bytea) IS
'Internal: _signed_values for one token: base64url-nopad(secret || HMAC-SHA256(key, path || secret [|| code])), the path and the code''s place from the type''s mailroom.token_actions row (MR125 without one).';

CREATE OR REPLACE FUNCTION mailroom.sign_token(
    p_action mailroom.token_action, p_secret bytea, p_code text DEFAULT null
)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_action IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'sign_token: the action must not be NULL';
    END IF;
    IF p_secret IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'sign_token: the secret must not be NULL';
    END IF;
    IF octet_length(p_secret) <> 32 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'secret must be 32 bytes';
    END IF;
    IF (mailroom_internal._token_action(p_action)).with_code AND (p_code IS NULL OR p_code !~ '^[0-9]{5}$') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('a %s code must be 5 digits', replace(p_action::text, '_', '-'));
    END IF;
    RETURN mailroom_internal._signed_value(p_action, p_secret, p_code, mailroom_internal._active_signing_key());
END;
$$;

COMMENT ON FUNCTION mailroom.sign_token(mailroom.token_action, bytea, text) IS
'The signed link value of a secret under the keyring''s active key: base64url-nopad(secret || HMAC-SHA256(key, path || secret [|| code])) '
'(the layout dequeue_tokens and claim_messages produce; for checking a verifier outside the database).';

GRANT EXECUTE ON FUNCTION mailroom.sign_token(mailroom.token_action, bytea, text) TO mailroom_admin;

-- Before token insert: expiry; revoke older open tokens of the same account and action (a
-- reissue supersedes them). No secret, code or digest yet: they are minted at dispatch
-- (dequeue_tokens, or claim_messages for a token email) and only their digests kept.
CREATE OR REPLACE FUNCTION mailroom_internal.trg_before_token_insert()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- whatever an insert passes (an older caller may still pass a secret), nothing rests in plaintext
    NEW.secret := NULL;
    NEW.code := NULL;
    NEW.secret_digest := NULL;
    NEW.code_digest := NULL;
    -- the clock is read only when the insert did not say (the activation token of an account insert
    -- carries its account's instant)
    NEW.created_at := coalesce(NEW.created_at, mailroom.clock());
    NEW.expires_at := coalesce(
        NEW.expires_at, NEW.created_at + mailroom.setting('tokens.ttl')::interval
    );
    -- A reissue supersedes the account's open tokens of that action. An account still being
    -- inserted (the activation token of its BEFORE INSERT trigger: the row is not there yet) has
    -- none, and a probe of its primary key costs far less than an UPDATE over every partition.
    -- On Citus (_triggers_cascade() false) this runs on a worker: _issue_token revokes instead.
    IF mailroom_internal._triggers_cascade() AND EXISTS (SELECT FROM mailroom.accounts AS a WHERE a.id = NEW.account) THEN
        UPDATE mailroom.tokens
        SET revoked_at = mailroom.clock()
        WHERE account = NEW.account
            AND action = NEW.action
            AND consumed_at IS NULL
            AND revoked_at IS NULL;
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_before_token_insert() IS
'Trigger: created_at, expires_at (tokens.ttl), no secret, code or digest (minted at dispatch); revoke older open tokens of that account and action.';

CREATE OR REPLACE TRIGGER before_token_insert
BEFORE INSERT ON mailroom.tokens
FOR EACH ROW
EXECUTE FUNCTION mailroom_internal.trg_before_token_insert();

-- Once dispatched, consumed or revoked, a token keeps only digests.
CREATE OR REPLACE FUNCTION mailroom_internal.trg_before_token_close()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.secret := NULL;
    NEW.code := NULL;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_before_token_close() IS
'Trigger: wipe the plaintext secret and code once a token is dispatched, consumed or revoked.';

CREATE OR REPLACE TRIGGER before_token_close
BEFORE UPDATE ON mailroom.tokens
FOR EACH ROW
WHEN (
    (new.secret IS NOT null OR new.code IS NOT null)
    AND (
        new.dispatched_at IS NOT null
        OR new.consumed_at IS NOT null
        OR new.revoked_at IS NOT null
    )
)
EXECUTE FUNCTION mailroom_internal.trg_before_token_close();

-- 3. After token consumed: consuming a token of a type that activates (activation) activates a
--    provisioned account.
CREATE OR REPLACE FUNCTION mailroom_internal.trg_after_token_consumed()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF (mailroom_internal._token_action(NEW.action)).activates_account THEN
        UPDATE mailroom.accounts
        SET status = 'active', status_changed_at = mailroom.clock()
        WHERE id = NEW.account
            AND status = 'provisioned';
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_after_token_consumed() IS
'Trigger: a consumed token of a type that activates (mailroom.token_actions) activates its provisioned account.';

CREATE OR REPLACE TRIGGER after_token_consumed
AFTER UPDATE OF consumed_at ON mailroom.tokens
FOR EACH ROW
WHEN (new.consumed_at IS NOT null AND old.consumed_at IS null)
EXECUTE FUNCTION mailroom_internal.trg_after_token_consumed();

-- 4. After tokens inserted: ONE notification per statement, payload = the
--    number of tokens. The activation tokens that the accounts BEFORE INSERT
--    trigger inserts (one nested INSERT per account) are not announced one by
--    one: the trigger is skipped inside another trigger (WHEN depth < 1), and
--    the accounts statement trigger below announces them all at once, so
--    inserting 100,000 accounts in one statement raises one notification.
--    The channel ALWAYS notifies (since migration 0190), registered or not: it is the seed's
--    contract, and a plain `LISTEN token_insert` (psql, the seed's C collector, any listener
--    of your own) hears every statement that inserts tokens. The registry of sql/08_notify.sql
--    covers the delivery channels only (docs/architecture.md, "NOTIFY, channel by channel").
CREATE OR REPLACE FUNCTION mailroom_internal._announce_tokens(p_count bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_count > 0 THEN
        PERFORM pg_notify(mailroom.setting('tokens.channel'), p_count::text);
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._announce_tokens(bigint) IS
'Internal: NOTIFY tokens.channel with the number of tokens a statement inserted (nothing for 0); always, listened or not (the seed''s contract).';

CREATE OR REPLACE FUNCTION mailroom_internal.trg_after_tokens_inserted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM mailroom_internal._announce_tokens((SELECT count(*) FROM inserted));
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_after_tokens_inserted() IS
'Trigger (statement): one NOTIFY per INSERT statement on tokens.channel, payload = number of tokens inserted.';

CREATE OR REPLACE TRIGGER after_tokens_inserted
AFTER INSERT ON mailroom.tokens
REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT
WHEN (pg_trigger_depth() < 1)
EXECUTE FUNCTION mailroom_internal.trg_after_tokens_inserted();

CREATE OR REPLACE FUNCTION mailroom_internal.trg_after_accounts_inserted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- every account inserted as provisioned got one activation token
    PERFORM mailroom_internal._announce_tokens((SELECT count(*) FROM inserted WHERE status = 'provisioned'));
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_after_accounts_inserted() IS
'Trigger (statement): announce the activation tokens created by this INSERT on accounts in one NOTIFY.';

CREATE OR REPLACE TRIGGER after_accounts_inserted
AFTER INSERT ON mailroom.accounts
REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT
EXECUTE FUNCTION mailroom_internal.trg_after_accounts_inserted();

-- A new token of an action for an account (a reissue: recovery). On one node the INSERT's triggers
-- revoke the account's older open tokens of that action and announce it; on Citus, where those
-- triggers would run on a worker, sql/citus/12 does both here, on the coordinator.
-- Its Citus form: sql/citus/12_accounts.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._issue_token(p_account bigint, p_action mailroom.token_action)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO mailroom.tokens (account, action)
    VALUES (p_account, p_action)
    RETURNING id INTO v_id;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._issue_token(bigint, mailroom.token_action) IS
'Internal: insert a token of p_action for p_account (older open ones of that action revoked, the token announced); returns its id.';

-- Which tokens may be used: a token while its account is in its type's eligible status
-- (mailroom.token_actions: activation while provisioned, password recovery while active); a type
-- without a row, never. The dequeue filters on it (after the index found the pending tokens) and
-- consume_token checks it under the account's row lock.
CREATE OR REPLACE FUNCTION mailroom_internal._token_eligible(
    p_action mailroom.token_action, p_status mailroom.account_status
)
RETURNS boolean
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL (its lookup planned once a session): the dequeue calls it for every pending token
    RETURN coalesce(
        (SELECT a.eligible_status = p_status FROM mailroom.token_actions AS a WHERE a.action = p_action),
        FALSE
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._token_eligible(mailroom.token_action, mailroom.account_status) IS
'Internal: true when a token of this action may be dispatched or used for an account in this status '
'(its eligible_status in mailroom.token_actions); false for NULL or a type without a row.';

-- The dequeue: every eligible token exactly once, whatever the commit order
-- and however many callers run at once. Rows are claimed with
-- FOR UPDATE SKIP LOCKED through the partial index tokens_pending_idx and
-- marked dispatched in the caller's transaction (rollback = still pending).
-- EXECUTE plans each call with the actual limit (no generic plan). The
-- UPDATE in "marked" runs to completion although the final SELECT does not
-- read it (PostgreSQL executes data-modifying CTEs exactly once), and every
-- picked row is locked by us, so every returned row is marked. "closed"
-- retires up to 1000 expired, never-dispatched tokens per call
-- (revoked_at = expires_at) through tokens_pending_expiry_idx,
-- so they do not pile up in tokens_pending_idx and slow the scan down.
-- p_mint (dequeue_tokens): each picked token gets its secret and code here, where they are
-- first needed; the row keeps their digests, the caller gets them signed ($2 the key). Without
-- p_mint (enqueue_token_emails) nothing is minted: claim_messages mints at each delivery attempt.
CREATE OR REPLACE FUNCTION mailroom_internal._dequeue_tokens_sql(p_mint boolean DEFAULT true)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_picked text := $q$
        WITH picked AS (
            SELECT t.id, t.created_at, t.action, a.email, a.login
            FROM mailroom.tokens AS t
            INNER JOIN mailroom.accounts AS a ON t.account = a.id
            -- eligibility is the type's row (what _token_eligible reads), joined: a PL/pgSQL call
            -- a row ran its lookup once a token (~45 us); a type without a row is never picked
            INNER JOIN mailroom.token_actions AS ta ON t.action = ta.action AND a.status = ta.eligible_status
            WHERE t.dispatched_at IS NULL
                AND t.consumed_at IS NULL
                AND t.revoked_at IS NULL
                AND t.expires_at > $3
                -- made by now (always so for a live collector): a pinned clock before the
                -- installation's tokens meets its own alone (as the claim's _outbound_due)
                AND t.created_at <= $3
            ORDER BY t.id
            LIMIT $1
            FOR UPDATE OF t SKIP LOCKED
        ),
        closed AS (
            UPDATE mailroom.tokens AS t
            SET revoked_at = t.expires_at
            WHERE (t.id, t.created_at) IN (
                SELECT x.id, x.created_at
                FROM mailroom.tokens AS x
                WHERE x.dispatched_at IS NULL
                    AND x.consumed_at IS NULL
                    AND x.revoked_at IS NULL
                    AND x.expires_at <= $3
                ORDER BY x.expires_at
                LIMIT 1000
                FOR UPDATE SKIP LOCKED
            )
        ),
$q$;
BEGIN
    IF NOT p_mint THEN
        RETURN v_picked || $q$
        marked AS (
            UPDATE mailroom.tokens AS t
            SET dispatched_at = $3
            -- (id, created_at): the primary key of the partitioned table, one pruned probe a row
            WHERE (t.id, t.created_at) IN (SELECT p.id, p.created_at FROM picked AS p)
        )
        SELECT p.action, p.email, p.login, NULL::text AS signed, NULL::text AS code, p.id
        FROM picked AS p
        ORDER BY p.id
$q$;
    END IF;
    RETURN v_picked || $q$
        pool AS MATERIALIZED (
            -- the batch's randomness in one draw from pgcrypto's CSPRNG, 35 bytes a token (a 32-byte
            -- secret, 3 bytes for its code), at most 1024 bytes a call: a secret and a code drawn by
            -- two PL/pgSQL calls a token cost ~60 us of the ~170 us a token
            SELECT string_agg(mailroom_internal._random_bytes(1024), ''::bytea) AS bytes
            FROM generate_series(1, (SELECT (count(*)::integer * 35 + 1023) / 1024 FROM picked))
        ),
        drawn AS MATERIALIZED (
            SELECT p.id, p.created_at, p.action, p.email, p.login,
                substring(r.bytes FROM p.o + 1 FOR 32) AS secret,
                (get_byte(r.bytes, p.o + 32) << 16) | (get_byte(r.bytes, p.o + 33) << 8)
                | get_byte(r.bytes, p.o + 34) AS v
            FROM (SELECT q.*, (row_number() OVER (ORDER BY q.id) - 1)::integer * 35 AS o FROM picked AS q) AS p,
                pool AS r
        ),
        minted AS MATERIALIZED (
            -- the code as _random_code draws it: 24 random bits, rejection above 16700000 =
            -- 167 * 10^5 (so v % 10^5 is uniform); a rejected draw (0.46%) takes _random_code's own
            SELECT d.id, d.created_at, d.action, d.email, d.login, d.secret,
                CASE
                    WHEN d.v < 16700000 THEN lpad((d.v % 100000)::text, 5, '0')
                    ELSE mailroom_internal._random_code()
                END AS code
            FROM drawn AS d
        ),
        marked AS (
            UPDATE mailroom.tokens AS t
            -- SHA-256 by the core's sha256() (the same bytes as the _digest wrapper's, 'sha256',
            -- without a PL/pgSQL wrapper call a digest)
            SET dispatched_at = $3,
                secret_digest = sha256(m.secret),
                code_digest = sha256(m.secret || convert_to(m.code, 'UTF8'))
            FROM minted AS m
            -- (id, created_at): the primary key of the partitioned table, one pruned probe a row
            WHERE t.id = m.id AND t.created_at = m.created_at
        ),
        batch AS (
            SELECT
                array_agg(m.id ORDER BY m.id) AS ids,
                array_agg(m.action ORDER BY m.id) AS actions,
                array_agg(m.email ORDER BY m.id) AS emails,
                array_agg(m.login ORDER BY m.id) AS logins,
                array_agg(m.secret ORDER BY m.id) AS secrets,
                array_agg(m.code ORDER BY m.id) AS codes
            FROM minted AS m
        )
        SELECT u.action, u.email, u.login, u.signed, u.code, u.id
        FROM batch AS b,
            unnest(
                b.actions, b.emails, b.logins,
                mailroom_internal._signed_values(b.actions, b.secrets, b.codes, $2),
                b.codes, b.ids
            ) AS u (action, email, login, signed, code, id)
        ORDER BY u.id
$q$;
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._dequeue_tokens_sql(boolean) IS
'Internal: the statement dequeue_tokens executes ($1 limit, $2 key, $3 now); p_mint false: enqueue_token_emails'' (no secret minted); tests EXPLAIN it.';

-- Its Citus form: sql/citus/12_accounts.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._dequeue_tokens(p_limit integer, p_key bytea, p_mint boolean)
RETURNS TABLE (
    action mailroom.token_action,
    email text,
    login text,
    signed text,
    code text,
    token_id bigint
)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- the minted rows are written back by primary-key probes, each pruned to one partition
SET enable_hashjoin = off
SET enable_mergejoin = off
-- the pick walks the pending tokens in id order (a merge of each partition's partial index) and
-- stops at the limit: statistics taken while few tokens were pending made the planner join every
-- pending token to its account and sort them (50 ms at 3,000 pending for a limit of 100, growing
-- with the backlog). A disabled node costs 1e10, past jit_above_cost: no JIT (700 ms a call).
SET enable_sort = off
SET jit = off
AS $fn$
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('dequeue_tokens: limit must be a positive integer, got %s',
                coalesce(p_limit::text, 'NULL'));
    END IF;
    RETURN QUERY EXECUTE mailroom_internal._dequeue_tokens_sql(p_mint)
        USING p_limit, p_key, mailroom.clock();
    -- Then pending password-recovery requests become tokens (sql/13_recovery.sql: the request did
    -- the same work for every address; the decision is taken here). They are not handed out by
    -- this call, whose statement did not see them: a token must exist for others (consume_token)
    -- before its link is out. Their INSERT announces them at commit, and the next call returns them.
    PERFORM mailroom_internal._issue_requested_recoveries(p_limit);
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._dequeue_tokens(integer, bytea, boolean) IS
'Internal: claim up to p_limit eligible tokens and mark them dispatched (p_mint: mint, keep digests, sign with p_key), '
'then issue the pending recovery requests the policy allows, for the next call.';

CREATE OR REPLACE FUNCTION mailroom.dequeue_tokens(p_limit integer)
RETURNS TABLE (
    action mailroom.token_action,
    email text,
    login text,
    signed text,
    code text,
    token_id bigint
)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM mailroom_internal._dequeue_tokens(p_limit, mailroom_internal._active_signing_key(), true);
END;
$fn$;

COMMENT ON FUNCTION mailroom.dequeue_tokens(integer) IS
'Claim up to p_limit eligible tokens (SKIP LOCKED), mint each one''s secret and code (only digests are kept), mark them '
'dispatched in the caller''s transaction; return action, email, login, signed value (keyring''s active key), code, token_id by id.';

GRANT EXECUTE ON FUNCTION mailroom.dequeue_tokens(integer) TO mailroom_collector;

-- The keyed form of the previous release, for one release: a collector that has not been
-- restarted yet keeps signing with the key it passes, so links it hands out verify wherever they
-- did before (in the database once that key is imported: mailroom keys import).
CREATE OR REPLACE FUNCTION mailroom.dequeue_tokens(p_limit integer, p_key bytea)
RETURNS TABLE (
    action mailroom.token_action,
    email text,
    login text,
    signed text,
    code text,
    token_id bigint
)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM mailroom_internal._check_key(p_key);
    RETURN QUERY SELECT * FROM mailroom_internal._dequeue_tokens(p_limit, p_key, true);
END;
$fn$;

COMMENT ON FUNCTION mailroom.dequeue_tokens(integer, bytea) IS
'Deprecated since 0.2.0, removed in 0.3.0: dequeue_tokens(p_limit) signing with the passed key, for collectors of the previous release.';

GRANT EXECUTE ON FUNCTION mailroom.dequeue_tokens(integer, bytea) TO mailroom_collector;

-- A token email's delivery attempt (claim_messages): the token gets a fresh secret and code,
-- signed with the active key; its digests replace the previous attempt's, so only the link of
-- the latest attempt works. A token still open gets a fresh lifetime (tokens.ttl from now): a
-- mail retried after its token's expiry still carries a working link. A consumed or revoked
-- token stays so (its link is then refused by consume_token, as any used link is).
-- A seam: a token's secret digest was replaced (a new link minted). Nothing on one node; on Citus
-- (sql/citus/13) the lookup table token_digests, which routes a link to its account's shard,
-- forgets the old digest and learns the new one.
-- Its Citus form: sql/citus/13_token_digests.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._token_digest_replaced(p_account bigint, p_old bytea, p_new bytea)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM p_account, p_old, p_new;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._token_digest_replaced(bigint, bytea, bytea) IS
'Internal: a token''s secret digest p_old (NULL: none yet) became p_new (nothing on one node; Citus: token_digests).';

CREATE OR REPLACE FUNCTION mailroom_internal._mint_token(p_token_id bigint)
RETURNS TABLE (action mailroom.token_action, email text, login text, signed text, code text)
LANGUAGE plpgsql
VOLATILE
STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_ts timestamptz := mailroom.clock();
    v_secret bytea := mailroom_internal._random_bytes(32);
    v_code text := mailroom_internal._random_code();
    v_renewed timestamptz := v_ts + mailroom.setting('tokens.ttl')::interval;
    v_digest bytea := mailroom_internal._digest(v_secret, 'sha256');
    v_old bytea;
    v_account bigint;
    v_email text;
    v_login text;
    t record;
BEGIN
    -- the token's account first: the statements after name it (on Citus: one shard, where tokens
    -- are distributed by account), and its values are variables (Citus refuses a STABLE call in CASE)
    SELECT tk.account INTO v_account FROM mailroom.tokens AS tk WHERE tk.id = p_token_id;
    IF NOT FOUND THEN
        RETURN;  -- purged (tokens.retention): no link to send
    END IF;
    -- the row locked, and the digest of the link this one replaces (_token_digest_replaced)
    SELECT tk.secret_digest INTO v_old
    FROM mailroom.tokens AS tk
    WHERE tk.account = v_account AND tk.id = p_token_id
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE mailroom.tokens AS tk
    SET secret_digest = v_digest,
        code_digest = mailroom_internal._digest(v_secret || convert_to(v_code, 'UTF8'), 'sha256'),
        dispatched_at = coalesce(tk.dispatched_at, v_ts),
        expires_at = CASE
            WHEN tk.consumed_at IS NULL AND tk.revoked_at IS NULL THEN v_renewed
            ELSE tk.expires_at
        END
    WHERE tk.account = v_account AND tk.id = p_token_id
    RETURNING tk.action, tk.account INTO t;
    IF NOT FOUND THEN
        RETURN;  -- purged (tokens.retention): no link to send
    END IF;
    PERFORM mailroom_internal._token_digest_replaced(v_account, v_old, v_digest);
    -- the account's row read alone, the link signed outside it (on Citus the read goes to the
    -- account's shard, and a function over the keyring cannot be shipped there with it)
    SELECT a.email, a.login INTO v_email, v_login FROM mailroom.accounts AS a WHERE a.id = v_account;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT
        t.action,
        v_email,
        v_login,
        mailroom_internal._signed_value(t.action, v_secret, v_code, mailroom_internal._active_signing_key()),
        v_code;
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._mint_token(bigint) IS
'Internal: a fresh secret and code for a dispatched token (its digests replaced, an open token''s lifetime renewed), '
'signed with the active key; no row when the token is gone.';
