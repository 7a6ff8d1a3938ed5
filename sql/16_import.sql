-- Moving from the original mailroom (issue 33, item 8): the accounts and tokens of a database with
-- the seed's schema (public.accounts, public.tokens, public.jobs; epoch integers), one batch a call.
-- `mailroom db import-seed SOURCE_URL` reads the seed's rows and hands them here; every rule of the
-- import lives in this function:
--   - accounts: the seed's statuses are mailroom's (provisioned, active, suspended), its epoch
--     integers become timestamptz (to_timestamp); mailroom assigns its own ids (the seed's id only
--     maps the batch's tokens to their account).
--   - an email (case-insensitively) or a login that already exists is skipped and counted: as
--     already imported when the existing account has the same email, login and created_at (so a
--     second run imports nothing), else as a collision; an email or login mailroom's rules refuse
--     (MR101, MR104) is skipped and counted as invalid.
--   - tokens: only those still usable at mailroom.clock() come over (not consumed, expires_at
--     ahead); consumed and expired tokens are history and stay behind (counted). Of several usable
--     tokens of one account and action, the newest comes (mailroom keeps one open token per account
--     and action: an older one would be revoked by the newer's insert).
--   - the seed's collector dispatched (mailed) every token with id <= jobs.last_seq: those arrive
--     dispatched, with the digests of the secret and code the seed's users hold (computed where the
--     import runs: no secret travels), so their links consume through consume_token once the seed's
--     MAILROOM_SECRET_KEY is in the keyring (`mailroom keys import`); the others arrive undispatched,
--     without digests: mailroom's collector mints and mails them.
--   - an imported provisioned account that brings a usable activation token gets no second one (the
--     token its insert trigger issued is deleted before the seed's is inserted); one that brings
--     none keeps the trigger's fresh activation token, which the collector mails (counted).
-- Single node: on Citus the digest lookup table (sql/citus/13) is not filled here (untested there).

CREATE OR REPLACE FUNCTION mailroom.import_seed_accounts(
    p_accounts jsonb, p_tokens jsonb, p_dispatched_up_to bigint
)
RETURNS TABLE (item text, affected bigint)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_up_to bigint := coalesce(p_dispatched_up_to, 0);
    v_live_activation jsonb;
    v_map jsonb := '{}';
    v_existing record;
    v_reason text;
    v_id bigint;
    v_token_id bigint;
    v_token_created timestamptz;
    a record;
    t record;
    n_imported bigint := 0;
    n_already bigint := 0;
    n_email bigint := 0;
    n_login bigint := 0;
    n_invalid bigint := 0;
    n_issued bigint := 0;
    n_dispatched bigint := 0;
    n_undispatched bigint := 0;
    n_consumed bigint := 0;
    n_expired bigint := 0;
    n_superseded bigint := 0;
    n_orphaned bigint := 0;
BEGIN
    IF jsonb_typeof(p_accounts) IS DISTINCT FROM 'array' OR jsonb_typeof(p_tokens) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR130',
            MESSAGE = 'import_seed_accounts: p_accounts and p_tokens must be JSON arrays';
    END IF;
    IF EXISTS (
        SELECT
        FROM jsonb_to_recordset(p_accounts) AS x (id bigint, email text, login text, status text, created_at bigint)
        WHERE x.id IS NULL OR x.email IS NULL OR x.login IS NULL OR x.created_at IS NULL
            OR x.status IS NULL
            OR x.status NOT IN (SELECT e::text FROM unnest(enum_range(NULL::mailroom.account_status)) AS e)
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR130',
            MESSAGE = 'import_seed_accounts: an account lacks id, email, login, created_at or a known status';
    END IF;
    IF EXISTS (
        SELECT
        FROM jsonb_to_recordset(p_tokens)
            AS x (id bigint, action text, account bigint, expires_at bigint, created_at bigint, secret_digest text)
        WHERE x.id IS NULL OR x.account IS NULL OR x.expires_at IS NULL OR x.created_at IS NULL
            OR x.action IS NULL
            OR x.action NOT IN (SELECT e::text FROM unnest(enum_range(NULL::mailroom.token_action)) AS e)
            OR (x.id <= v_up_to AND (x.secret_digest IS NULL OR x.secret_digest !~ '^[0-9a-f]{64}$'))
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR130',
            MESSAGE = 'import_seed_accounts: a token lacks id, account, created_at, expires_at, a known action, '
            || 'or (dispatched) its secret digest';
    END IF;

    -- one import at a time: the collision checks below read what an earlier batch wrote. A row of
    -- mailroom.job_locks, waited for (no advisory lock: any login could take that one)
    PERFORM 1 FROM mailroom.job_locks AS j WHERE j.name = 'import_seed_accounts' FOR UPDATE;

    -- the seed accounts that bring a usable activation token (their insert issues no second one)
    SELECT coalesce(jsonb_object_agg(x.account::text, TRUE), '{}')
    INTO v_live_activation
    FROM jsonb_to_recordset(p_tokens) AS x (action text, account bigint, expires_at bigint, consumed_at bigint)
    WHERE x.action = 'activation' AND x.consumed_at IS NULL AND to_timestamp(x.expires_at) > v_now;

    FOR a IN
        SELECT x.*
        FROM jsonb_to_recordset(p_accounts) AS x (
            id bigint, email text, login text, status text, created_at bigint, status_changed_at bigint,
            activated_at bigint, suspended_at bigint, unsuspended_at bigint
        )
        ORDER BY x.id
    LOOP
        v_reason := NULL;
        BEGIN
            PERFORM mailroom_internal._check_account_identity(a.email, a.login);
        EXCEPTION
            WHEN SQLSTATE 'MR101' OR SQLSTATE 'MR104' THEN
                v_reason := 'invalid';
        END;
        IF v_reason IS NULL THEN
            SELECT x.login, x.created_at INTO v_existing
            FROM mailroom.accounts AS x
            WHERE lower(x.email) = lower(a.email);
            IF FOUND THEN
                v_reason := CASE
                    WHEN v_existing.login = a.login AND v_existing.created_at = to_timestamp(a.created_at)
                        THEN 'already'
                    ELSE 'email'
                END;
            ELSIF EXISTS (SELECT FROM mailroom.accounts AS x WHERE x.login = a.login) THEN
                v_reason := 'login';
            END IF;
        END IF;
        CASE v_reason
            WHEN 'invalid' THEN n_invalid := n_invalid + 1;
            WHEN 'already' THEN n_already := n_already + 1;
            WHEN 'email' THEN n_email := n_email + 1;
            WHEN 'login' THEN n_login := n_login + 1;
            ELSE
                INSERT INTO mailroom.accounts (
                    email, login, status, created_at, status_changed_at, activated_at, suspended_at, unsuspended_at
                )
                VALUES (
                    a.email, a.login, a.status::mailroom.account_status, to_timestamp(a.created_at),
                    to_timestamp(a.status_changed_at), to_timestamp(a.activated_at),
                    to_timestamp(a.suspended_at), to_timestamp(a.unsuspended_at)
                )
                RETURNING id INTO v_id;
                n_imported := n_imported + 1;
                v_map := v_map || jsonb_build_object(a.id::text, v_id);
                IF a.status = 'provisioned' THEN
                    IF v_live_activation ? a.id::text THEN
                        -- the activation token the insert trigger issued: the seed's comes instead
                        DELETE FROM mailroom.tokens AS tk WHERE tk.account = v_id;
                    ELSE
                        n_issued := n_issued + 1;
                    END IF;
                END IF;
        END CASE;
    END LOOP;

    FOR t IN
        SELECT
            x.*,
            (v_map ->> x.account::text)::bigint AS new_account,
            CASE
                WHEN NOT v_map ? x.account::text THEN 'orphaned'
                WHEN x.consumed_at IS NOT NULL THEN 'consumed'
                WHEN to_timestamp(x.expires_at) <= v_now THEN 'expired'
                WHEN x.id < max(x.id) FILTER (
                    WHERE x.consumed_at IS NULL AND to_timestamp(x.expires_at) > v_now
                ) OVER (PARTITION BY x.account, x.action) THEN 'superseded'
                WHEN x.id <= v_up_to THEN 'dispatched'
                ELSE 'undispatched'
            END AS outcome
        FROM jsonb_to_recordset(p_tokens) AS x (
            id bigint, action text, account bigint, expires_at bigint, consumed_at bigint, created_at bigint,
            secret_digest text, code_digest text
        )
        ORDER BY x.id
    LOOP
        CASE t.outcome
            WHEN 'orphaned' THEN n_orphaned := n_orphaned + 1;
            WHEN 'consumed' THEN n_consumed := n_consumed + 1;
            WHEN 'expired' THEN n_expired := n_expired + 1;
            WHEN 'superseded' THEN n_superseded := n_superseded + 1;
            ELSE
                -- the seed does not record when it mailed a token: dispatched as of its creation
                INSERT INTO mailroom.tokens (account, action, created_at, expires_at, dispatched_at)
                VALUES (
                    t.new_account, t.action::mailroom.token_action, to_timestamp(t.created_at),
                    to_timestamp(t.expires_at),
                    CASE WHEN t.outcome = 'dispatched' THEN to_timestamp(t.created_at) END
                )
                RETURNING id, created_at INTO v_token_id, v_token_created;
                IF t.outcome = 'dispatched' THEN
                    -- after the insert: its trigger clears whatever digest an INSERT passes
                    UPDATE mailroom.tokens AS tk
                    SET secret_digest = decode(t.secret_digest, 'hex'),
                        code_digest = decode(t.code_digest, 'hex')
                    WHERE tk.id = v_token_id AND tk.created_at = v_token_created;
                    n_dispatched := n_dispatched + 1;
                ELSE
                    n_undispatched := n_undispatched + 1;
                END IF;
        END CASE;
    END LOOP;

    RETURN QUERY
    SELECT v.item, v.affected
    FROM (
        VALUES
        (1, 'accounts imported', n_imported),
        (2, 'accounts skipped: already imported', n_already),
        (3, 'accounts skipped: email exists', n_email),
        (4, 'accounts skipped: login exists', n_login),
        (5, 'accounts skipped: invalid email or login', n_invalid),
        (6, 'activation tokens issued (provisioned, none usable in the seed)', n_issued),
        (7, 'tokens imported dispatched', n_dispatched),
        (8, 'tokens imported undispatched', n_undispatched),
        (9, 'tokens left: consumed', n_consumed),
        (10, 'tokens left: expired', n_expired),
        (11, 'tokens left: superseded by a newer one', n_superseded),
        (12, 'tokens left: their account skipped', n_orphaned)
    ) AS v (n, item, affected)
    ORDER BY v.n;
END;
$$;

COMMENT ON FUNCTION mailroom.import_seed_accounts(jsonb, jsonb, bigint) IS
'Import one batch of the original mailroom''s accounts and tokens (epoch integers; tokens with their secret and code digests, '
'id <= p_dispatched_up_to arrive dispatched); existing emails or logins are skipped; returns counts (item, affected). Errors: MR130 malformed batch.';

GRANT EXECUTE ON FUNCTION mailroom.import_seed_accounts(jsonb, jsonb, bigint) TO mailroom_admin;
