-- Accounts and tokens on Citus (issue 26; docs/scale.md). Before 15_functions; on a first
-- install each file of sql/citus/ is sent whole, and a CREATE OR REPLACE of a function already a
-- Citus object is propagated with its source text, which must then be one statement.
--: accounts are distributed by id and tokens
-- by account, colocated (sql/citus/10), so each statement on one account runs on its shard.
--
-- - login and lower(email) are unique through two lookup tables distributed by those keys
--   (account_logins, account_emails), written by create_account (below) before the account row:
--   ON CONFLICT DO NOTHING on each names the key taken (MR102, MR103) as on one node. No API
--   function changes an account's login or email; a direct UPDATE of them must change the lookup
--   rows too (docs/scale.md, Limits).
-- - Triggers on these tables run on the workers, where a statement on another table (or a NOTIFY,
--   heard by nobody there) cannot run. Only row-local triggers stay (validation, timestamps,
--   status rules, plaintext clearing); what the others did is done here, on the coordinator, by the
--   functions: the activation token and its announcement (create_account), a reissue's revocation
--   of older tokens and its announcement (_issue_token), activation on consume (_after_consume).
-- - dequeue_tokens takes tokens shard by shard (FOR UPDATE SKIP LOCKED runs only in a single-shard
--   statement), as the outbound claim walks lanes (sql/citus/20).

SELECT set_config('citus.enable_unsafe_triggers', 'on', true);
-- the lookup tables are created and filled in the transaction that then replaces functions Citus
-- copied to the workers: one connection per worker, or the function commands are refused
SELECT set_config('citus.multi_shard_modify_mode', 'sequential', true);

CREATE TABLE IF NOT EXISTS mailroom.account_emails (
    email text PRIMARY KEY,  -- lower(accounts.email)
    account bigint NOT NULL
);

CREATE TABLE IF NOT EXISTS mailroom.account_logins (
    login text PRIMARY KEY,
    account bigint NOT NULL
);

DO $lookups$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.account_emails'::regclass
    ) THEN
        PERFORM create_distributed_table('mailroom.account_emails', 'email', colocate_with => 'none');
        -- an installation moved to Citus: its accounts so far
        INSERT INTO mailroom.account_emails (email, account) SELECT lower(a.email), a.id FROM mailroom.accounts AS a;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = 'mailroom.account_logins'::regclass
    ) THEN
        PERFORM create_distributed_table('mailroom.account_logins', 'login', colocate_with => 'mailroom.account_emails');
        INSERT INTO mailroom.account_logins (login, account) SELECT a.login, a.id FROM mailroom.accounts AS a;
    END IF;
END;
$lookups$;

-- statement triggers reading a transition table (Citus cannot plan them) and the triggers that
-- write another table: their work is in the functions below
DROP TRIGGER IF EXISTS after_accounts_inserted ON mailroom.accounts;
DROP TRIGGER IF EXISTS after_tokens_inserted ON mailroom.tokens;
DROP TRIGGER IF EXISTS after_token_consumed ON mailroom.tokens;

-- sql/10's seam: row triggers run on the shards here, where they cannot write another table; the
-- row-local part of sql/10's and sql/11's token triggers stays (validate, stamp, no plaintext), and
-- create_account (_insert_account below) and _issue_token do the rest on the coordinator
CREATE OR REPLACE FUNCTION mailroom_internal._triggers_cascade()
RETURNS boolean
LANGUAGE plpgsql
STABLE  -- not IMMUTABLE: never folded into a cached plan, so the Citus form takes over at once
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN false;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._triggers_cascade() IS
'Internal (Citus): false: row triggers run on a shard and write no other table (the functions do it on the coordinator).';

CREATE OR REPLACE FUNCTION mailroom_internal._issue_token(p_account bigint, p_action mailroom.token_action)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ts timestamptz := mailroom.clock();
    v_id bigint;
BEGIN
    -- a reissue supersedes the account's open tokens of that action (one shard: the account's)
    UPDATE mailroom.tokens
    SET revoked_at = v_ts
    WHERE account = p_account
        AND action = p_action
        AND consumed_at IS NULL
        AND revoked_at IS NULL;
    INSERT INTO mailroom.tokens (account, action, created_at, expires_at)
    VALUES (p_account, p_action, v_ts, v_ts + mailroom.setting('tokens.ttl')::interval)
    RETURNING id INTO v_id;
    -- raised here, on the coordinator, where the collector listens
    PERFORM mailroom_internal._announce_tokens(1);
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._issue_token(bigint, mailroom.token_action) IS
'Internal (Citus): revoke the account''s open tokens of p_action, insert a new one, announce it (on the coordinator); returns its id.';

CREATE OR REPLACE FUNCTION mailroom_internal._lock_account_by_email(p_email_lower text)
RETURNS TABLE (id bigint, status mailroom.account_status)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_account bigint;
BEGIN
    SELECT e.account INTO v_account FROM mailroom.account_emails AS e WHERE e.email = p_email_lower;
    IF v_account IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT a.id, a.status
    FROM mailroom.accounts AS a
    WHERE a.id = v_account
    FOR NO KEY UPDATE;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._lock_account_by_email(text) IS
'Internal (Citus): the account of an address through account_emails, its row locked on its shard (no row: none).';

-- Ids placed beside a key (issue 37): a row written with its lookup row commits in one phase
-- when both are on one worker, in two (PREPARE and COMMIT PREPARED on each worker) when not. The
-- lookup tables are distributed by text (an address, an email), the rows by a bigint id, so they
-- cannot be colocated; but the id is ours to choose: the next value of its sequence whose shard is
-- on the worker of the key's shard (about one value in N skipped with N workers). A placement
-- that moves (the rebalancer) only costs the two phases again, never correctness.
CREATE OR REPLACE FUNCTION mailroom_internal._shard_node(p_shard bigint)
RETURNS integer
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT min(pl.groupid) FROM pg_catalog.pg_dist_placement AS pl WHERE pl.shardid = p_shard
$$;

COMMENT ON FUNCTION mailroom_internal._shard_node(bigint) IS
'Internal (Citus): the node (Citus group) holding this shard.';

CREATE OR REPLACE FUNCTION mailroom_internal._id_beside(p_sequence regclass, p_table regclass, p_node integer)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    -- at most 64 values: with a node that holds no shard of p_table, the last one
    FOR v_try IN 1..64 LOOP
        v_id := nextval(p_sequence);
        EXIT WHEN mailroom_internal._shard_node(get_shard_id_for_distribution_column(p_table, v_id)) = p_node;
    END LOOP;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._id_beside(regclass, regclass, integer) IS
'Internal (Citus): the next value of p_sequence whose shard of p_table (distributed by that id) is on node p_node (at most 64 tries).';

-- sql/10's seam of create_account: the keys reserved in their lookup tables, then the account
-- row and its activation token (create_account raises MR102/MR103 for the key named taken)
CREATE OR REPLACE FUNCTION mailroom_internal._insert_account(p_email text, p_login text, OUT id bigint, OUT taken text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_now timestamptz;
BEGIN
    -- as on one node, a bad email or login is refused before any key is looked at
    PERFORM mailroom_internal._check_account_identity(p_email, p_login);
    -- the account (and its token) on the worker of its email's lookup row (_id_beside): one phase
    -- when the login's row is there too
    v_id := mailroom_internal._id_beside(
        pg_catalog.pg_get_serial_sequence('mailroom.accounts', 'id')::regclass, 'mailroom.accounts',
        mailroom_internal._shard_node(get_shard_id_for_distribution_column('mailroom.account_emails', lower(p_email)))
    );
    -- each key on its own shard: ON CONFLICT DO NOTHING waits for a concurrent insert of the same
    -- key to end, then says whether it was taken; email first, as on one node (MR102 before MR103)
    INSERT INTO mailroom.account_emails (email, account) VALUES (lower(p_email), v_id) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        taken := 'email';
        RETURN;
    END IF;
    INSERT INTO mailroom.account_logins (login, account) VALUES (p_login, v_id) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        taken := 'login';  -- create_account's error rolls the email's reservation back
        RETURN;
    END IF;
    -- created_at from the coordinator's clock (the row's trigger runs on a worker, sql/10)
    INSERT INTO mailroom.accounts (id, email, login, created_at) VALUES (v_id, p_email, p_login, mailroom.clock());
    -- its activation token, as _issue_token without the revocation (a new account has no token
    -- to supersede: one statement on the worker fewer)
    v_now := mailroom.clock();
    INSERT INTO mailroom.tokens (account, action, created_at, expires_at)
    VALUES (v_id, 'activation', v_now, v_now + mailroom.setting('tokens.ttl')::interval);
    PERFORM mailroom_internal._announce_tokens(1);
    id := v_id;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._insert_account(text, text) IS
'Internal (Citus): reserve the account''s email and login in account_emails and account_logins, insert it and its activation token; (its id, NULL) or (NULL, the key taken).';

-- activation on consume, done on a single node by the trigger after_token_consumed
CREATE OR REPLACE FUNCTION mailroom_internal._after_consume(p_account bigint, p_action mailroom.token_action)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF (mailroom_internal._token_action(p_action)).activates_account THEN
        UPDATE mailroom.accounts AS a
        SET status = 'active', status_changed_at = mailroom.clock()  -- the coordinator's clock (sql/10)
        WHERE a.id = p_account
            AND a.status = 'provisioned';
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._after_consume(bigint, mailroom.token_action) IS
'Internal (Citus): the activation of a provisioned account whose activation token was consumed (the trigger after_token_consumed of one node, which cannot run on a worker).';

-- The dequeue, shard by shard: pending tokens are listed without a lock (a fan-out read), their
-- accounts grouped by shard, and in each shard, from a random one, one statement with those
-- accounts written into its text (Citus routes `account = ANY(<constant array>)` of one shard's
-- values to that shard) locks them FOR UPDATE SKIP LOCKED, re-checking that each is still
-- pending, and marks them as sql/11 does. Every token still goes to one caller: SKIP LOCKED and the
-- re-check within the shard, as on one node. Expired tokens are retired by one multi-shard
-- UPDATE (no LIMIT, no SKIP LOCKED on Citus). The statement follows sql/11's _dequeue_tokens_sql:
-- a change there is made here too (tests/citus run the collector on this path).
CREATE OR REPLACE FUNCTION mailroom_internal._dequeue_tokens_shard_sql(p_accounts bigint[], p_mint boolean)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_in text := format('= ANY (%L::bigint[])', p_accounts);
    v_picked text;
BEGIN
    v_picked := format($q$
        WITH picked AS (
            SELECT t.id, t.created_at, t.account, t.action, a.email, a.login
            FROM mailroom.tokens AS t
            INNER JOIN mailroom.accounts AS a ON t.account = a.id
            INNER JOIN mailroom.token_actions AS ta ON t.action = ta.action
            WHERE t.account %1$s
                AND a.id %1$s
                AND t.dispatched_at IS NULL
                AND t.consumed_at IS NULL
                AND t.revoked_at IS NULL
                AND t.expires_at > $3
                AND t.created_at <= $3
                AND ta.eligible_status = a.status
            ORDER BY t.id
            LIMIT $1
            FOR UPDATE OF t SKIP LOCKED
        ),
$q$, v_in);
    IF NOT p_mint THEN
        RETURN v_picked || format($q$
        marked AS (
            UPDATE mailroom.tokens AS t
            SET dispatched_at = $3
            FROM picked AS p
            WHERE t.account %1$s AND t.account = p.account AND t.id = p.id AND t.created_at = p.created_at
        )
        SELECT p.action, p.email, p.login, NULL::text AS signed, NULL::text AS code, p.id
        FROM picked AS p
        ORDER BY p.id
$q$, v_in);
    END IF;
    RETURN v_picked || format($q$
        minted AS MATERIALIZED (
            SELECT p.id, p.created_at, p.account, p.action, p.email, p.login,
                mailroom_internal._random_bytes(32) AS secret, mailroom_internal._random_code() AS code
            FROM picked AS p
        ),
        marked AS (
            UPDATE mailroom.tokens AS t
            SET dispatched_at = $3,
                secret_digest = mailroom_internal._digest(m.secret, 'sha256'),
                code_digest = mailroom_internal._digest(m.secret || m.code::bytea, 'sha256')  -- 5 ASCII digits: the cast is their UTF-8 (convert_to is STABLE, refused here)
            FROM minted AS m
            WHERE t.account %1$s AND t.account = m.account AND t.id = m.id AND t.created_at = m.created_at
        ),
        done AS (SELECT 1)
        -- signed on the coordinator (sql/citus/12 _dequeue_tokens): Citus refuses a STABLE function
        -- (_signed_values) over columns in a statement that writes
        SELECT m.action, m.email, m.login, m.secret, m.code, m.id, m.account
        FROM minted AS m
        ORDER BY m.id
$q$, v_in);
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._dequeue_tokens_shard_sql(bigint[], boolean) IS
'Internal (Citus): the single-shard dequeue statement for these accounts (all on one shard): $1 limit, $2 key, $3 now.';

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
SET jit = off
AS $fn$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_left integer := p_limit;
    v_accounts bigint[];
    v_shard bigint[];
    v_n integer;
    r record;
    v_actions mailroom.token_action[] := '{}';
    v_emails text[] := '{}';
    v_logins text[] := '{}';
    v_secrets bytea[] := '{}';
    v_codes text[] := '{}';
    v_ids bigint[] := '{}';
    v_owners bigint[] := '{}';
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('dequeue_tokens: limit must be a positive integer, got %s',
                coalesce(p_limit::text, 'NULL'));
    END IF;
    -- expired pending tokens retired: looked for first (a read opens no write on the workers),
    -- so a dequeue with none does not write every shard and commit both workers in two phases.
    -- A plain read with its LIMIT, not EXISTS (…): Citus made that sublink an intermediate result,
    -- a transaction on every worker and a second statement on the coordinator (issue 46).
    PERFORM 1 FROM mailroom.tokens AS t
    WHERE t.dispatched_at IS NULL
        AND t.consumed_at IS NULL
        AND t.revoked_at IS NULL
        AND t.expires_at <= v_now
    LIMIT 1;
    IF FOUND THEN
        UPDATE mailroom.tokens AS t
        SET revoked_at = t.expires_at
        WHERE t.dispatched_at IS NULL
            AND t.consumed_at IS NULL
            AND t.revoked_at IS NULL
            AND t.expires_at <= v_now;
    END IF;
    -- candidates, unlocked: twice the limit, so tokens a concurrent caller holds leave enough. Read
    -- by a loop over the statement itself (as a subquery its ordered read became an intermediate
    -- result: a transaction on every worker and a second statement on the coordinator; issue 46)
    v_accounts := '{}';
    FOR r IN
        SELECT t.account
        FROM mailroom.tokens AS t
        WHERE t.dispatched_at IS NULL
            AND t.consumed_at IS NULL
            AND t.revoked_at IS NULL
            AND t.expires_at > v_now
            AND t.created_at <= v_now
        ORDER BY t.id
        LIMIT 2 * p_limit
    LOOP
        v_accounts := v_accounts || r.account;
    END LOOP;
    v_accounts := CASE WHEN cardinality(v_accounts) > 0 THEN ARRAY(SELECT DISTINCT u.a FROM unnest(v_accounts) AS u (a)) END;
    IF v_accounts IS NOT NULL THEN
        FOR v_shard IN
            SELECT array_agg(u.account ORDER BY u.account)
            FROM unnest(v_accounts) AS u (account)
            GROUP BY get_shard_id_for_distribution_column('mailroom.tokens', u.account)
            ORDER BY random()
        LOOP
            EXIT WHEN v_left < 1;
            IF p_mint THEN
                FOR r IN EXECUTE mailroom_internal._dequeue_tokens_shard_sql(v_shard, p_mint) USING v_left, p_key, v_now LOOP
                    v_actions := v_actions || r.action;
                    v_emails := v_emails || r.email;
                    v_logins := v_logins || r.login;
                    v_secrets := v_secrets || r.secret;
                    v_codes := v_codes || r.code;
                    v_ids := v_ids || r.id;
                    v_owners := v_owners || r.account;
                    v_left := v_left - 1;
                END LOOP;
            ELSE
                RETURN QUERY EXECUTE mailroom_internal._dequeue_tokens_shard_sql(v_shard, p_mint)
                    USING v_left, p_key, v_now;
                GET DIAGNOSTICS v_n = ROW_COUNT;
                v_left := v_left - v_n;
            END IF;
        END LOOP;
    END IF;
    IF p_mint AND cardinality(v_ids) > 0 THEN
        -- the new digests' lookup rows (sql/citus/13), so consume_token finds each token's shard. One
        -- by a routed INSERT: Citus makes an INSERT … SELECT from the coordinator a COPY, which always
        -- commits in two phases, even on one worker (issue 46)
        IF cardinality(v_ids) = 1 THEN
            INSERT INTO mailroom.token_digests (secret_digest, account)
            VALUES (mailroom_internal._digest(v_secrets[1], 'sha256'), v_owners[1]);
        ELSE
            INSERT INTO mailroom.token_digests (secret_digest, account)
            SELECT mailroom_internal._digest(u.secret, 'sha256'), u.account
            FROM unnest(v_secrets, v_owners) AS u (secret, account);
        END IF;
        RETURN QUERY
        SELECT u.action, u.email, u.login, u.signed, u.code, u.id
        FROM unnest(
            v_actions, v_emails, v_logins, mailroom_internal._signed_values(v_actions, v_secrets, v_codes, p_key), v_codes, v_ids
        ) AS u (action, email, login, signed, code, id)
        ORDER BY u.id;
    END IF;
    -- then pending recovery requests become tokens, for the next call (as sql/11)
    PERFORM mailroom_internal._issue_requested_recoveries(p_limit);
END;
$fn$;

-- its reads of every shard with one connection a worker (see _due_lanes, sql/citus/20)
DO $pool$
BEGIN
    EXECUTE 'ALTER FUNCTION mailroom_internal._dequeue_tokens(integer, bytea, boolean) '
        'SET citus.max_adaptive_executor_pool_size = 1';
END;
$pool$;

COMMENT ON FUNCTION mailroom_internal._dequeue_tokens(integer, bytea, boolean) IS
'Internal (Citus): claim up to p_limit eligible tokens shard by shard (single-shard SKIP LOCKED statements, from a random shard), '
'mark them dispatched (p_mint: mint, keep digests and their token_digests rows, sign with p_key), then issue the pending recovery requests the policy allows.';

-- Tokens past retention (partition maintenance, sql/05 and sql/citus/25): tokens are distributed,
-- and Citus runs FOR UPDATE SKIP LOCKED only on one shard, so on Citus a partition's closed or
-- expired tokens go in one multi-shard DELETE (no batch: closed tokens are not held by anyone).
CREATE OR REPLACE FUNCTION mailroom_internal._delete_tokens_past_retention(
    p_partition text, p_cutoff timestamptz, p_batch integer
)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count bigint := 0;
    v_digests bytea[] := '{}';
    v_digest bytea;
BEGIN
    FOR v_digest IN EXECUTE format(
        'DELETE FROM mailroom.%1$I AS t WHERE t.created_at < $1 '
        'AND (t.expires_at < $1 OR t.consumed_at < $1 OR t.revoked_at < $1) RETURNING t.secret_digest',
        p_partition
    ) USING p_cutoff LOOP
        v_count := v_count + 1;
        IF v_digest IS NOT NULL THEN
            v_digests := v_digests || v_digest;
        END IF;
    END LOOP;
    -- their lookup rows (sql/citus/13)
    PERFORM mailroom_internal._forget_digests(v_digests);
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_tokens_past_retention(text, timestamptz, integer) IS
'Internal (Citus): delete the closed or expired tokens past retention of one tokens partition (multi-shard, p_batch unused), '
'and their token_digests rows.';

-- Erasure (sql/07): an erased account's email and login are also kept in the lookup tables; they
-- go with it. By the accounts' ids and by the address's pattern (as erase_address matches
-- accounts), so rows left by an erasure before this override go too. Each a multi-shard DELETE
-- (the tables are distributed by the key, not by account).
CREATE OR REPLACE FUNCTION mailroom_internal._erase_account_keys(p_accounts bigint[], p_pattern text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM mailroom.account_emails AS e WHERE e.account = ANY (p_accounts) OR e.email ~* p_pattern;
    DELETE FROM mailroom.account_logins AS l WHERE l.account = ANY (p_accounts) OR l.login ~* p_pattern;
    -- their tokens are gone (erase_address deleted them first): so are their digests' lookup rows
    DELETE FROM mailroom.token_digests AS d WHERE d.account = ANY (p_accounts);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._erase_account_keys(bigint[], text) IS
'Internal (Citus, erase_address): delete the erased accounts'' rows of account_emails, account_logins and token_digests, '
'and any login or email row holding the address.';
