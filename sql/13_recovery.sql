-- Password recovery: the request records itself and nothing else, so an existing account and an
-- unknown address cost the same statements on the same pages (migration 0151); dequeue_tokens
-- then issues the tokens the recovery policy allows (docs/accounts.md, "Recovery policy"):
--
-- - per requester fingerprint (p_requester, e.g. a keyed hash of the client address; NULL: one
--   anonymous requester): at most recovery.requester_daily_cap tokens per account in 24 h
--   (anonymous requests have no such cap), at least recovery.min_interval apart;
-- - per account, all requesters together: recovery.daily_cap tokens in 24 h, then one per
--   recovery.capped_interval. Mail to an address is bounded by daily_cap + 24 h / capped_interval
--   a day, and strangers can delay its owner by capped_interval at most, never lock them out.
-- No advisory lock anywhere: requests are taken FOR UPDATE SKIP LOCKED, the account's row FOR NO
-- KEY UPDATE; neither can be locked by a role outside mailroom.

CREATE OR REPLACE FUNCTION mailroom.request_password_recovery(p_email text, p_requester text DEFAULT null)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF mailroom_internal._valid_email(p_email) IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = 'MR101', MESSAGE = 'invalid email address';
    END IF;
    IF octet_length(p_requester) > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'p_requester must be at most 1000 bytes';
    END IF;
    -- The same two statements for every address: whether it is an account is not looked at here.
    INSERT INTO mailroom.recovery_requests (requested_at, email, requester_digest)
    VALUES (mailroom.clock(), lower(p_email), mailroom_internal._digest(convert_to(p_requester, 'UTF8'), 'sha256'));
    PERFORM mailroom_internal._announce_tokens(1);
END;
$$;

COMMENT ON FUNCTION mailroom.request_password_recovery(text, text) IS
'Record a password-recovery request (p_requester: the requester''s fingerprint, e.g. a keyed hash of the client address; NULL: anonymous); dequeue_tokens issues the token if the address is an active account and the recovery policy allows. Same void result and the same work for every address. Errors: MR101 not an email address.';

GRANT EXECUTE ON FUNCTION mailroom.request_password_recovery(text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom_internal._recovery_allowed(p_account bigint, p_requester bytea, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_day timestamptz := p_now - interval '1 day';
    v_all integer;
    v_last_all timestamptz;
    v_mine integer;
    v_last_mine timestamptz;
BEGIN
    -- The recovery policy (see the top of this file); the caller holds the account's row lock.
    SELECT count(*), max(t.created_at) INTO v_all, v_last_all
    FROM mailroom.tokens AS t
    WHERE t.account = p_account AND t.action = 'password_recovery' AND t.created_at > v_day;
    SELECT count(*), max(r.handled_at) INTO v_mine, v_last_mine
    FROM mailroom.recovery_requests AS r
    WHERE r.account = p_account AND r.token_id IS NOT NULL AND r.handled_at > v_day
        AND r.requester_digest IS NOT DISTINCT FROM p_requester;
    IF v_last_mine > p_now - mailroom.setting('recovery.min_interval')::interval THEN
        RETURN false;
    END IF;
    IF p_requester IS NOT NULL AND v_mine >= mailroom.setting('recovery.requester_daily_cap')::integer THEN
        RETURN false;
    END IF;
    IF v_all >= mailroom.setting('recovery.daily_cap')::integer
        AND v_last_all > p_now - mailroom.setting('recovery.capped_interval')::interval THEN
        RETURN false;
    END IF;
    RETURN true;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._recovery_allowed(bigint, bytea, timestamptz) IS
'Internal: whether the recovery policy lets a requester (sha256 of its fingerprint, NULL: anonymous) have a new recovery token for an account now.';

CREATE OR REPLACE FUNCTION mailroom_internal._issue_requested_recoveries(p_limit integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_ttl interval;
    v_request record;
    v_account bigint;
    v_status mailroom.account_status;
    v_token bigint;
    v_issued integer := 0;
BEGIN
    -- Any pending request at all, first, by a read: a call with none locks nothing (on Citus the
    -- table is on the coordinator, and a row lock taken there makes the dequeue's commit a
    -- two-phase one; issue 46)
    PERFORM 1 FROM mailroom.recovery_requests AS r WHERE r.handled_at IS NULL AND r.requested_at <= v_now LIMIT 1;
    IF FOUND THEN
        v_ttl := mailroom.setting('tokens.ttl')::interval;
        -- Up to p_limit pending requests, oldest first; a concurrent caller skips the ones taken here.
        FOR v_request IN
            SELECT r.id, r.email, r.requester_digest, r.requested_at
            FROM mailroom.recovery_requests AS r
            WHERE r.handled_at IS NULL
                -- made by now (always so live): a pinned clock before them leaves them alone
                AND r.requested_at <= v_now
            ORDER BY r.id
            LIMIT greatest(p_limit, 1)
            FOR UPDATE SKIP LOCKED
        LOOP
            v_account := NULL;
            v_status := NULL;
            v_token := NULL;
            -- a request older than a token's life is answered with nothing (a late mail would surprise)
            IF v_request.requested_at > v_now - v_ttl THEN
                -- the account's row lock serialises the policy for one account across collectors
                SELECT l.id, l.status INTO v_account, v_status
                FROM mailroom_internal._lock_account_by_email(v_request.email) AS l;
                IF v_status = 'active' AND mailroom_internal._recovery_allowed(v_account, v_request.requester_digest, v_now) THEN
                    v_token := mailroom_internal._issue_token(v_account, 'password_recovery');
                    v_issued := v_issued + 1;
                END IF;
            END IF;
            IF v_token IS NULL THEN
                -- nothing issued: nothing to keep, not even the address
                DELETE FROM mailroom.recovery_requests AS r WHERE r.id = v_request.id;
            ELSE
                UPDATE mailroom.recovery_requests AS r
                SET handled_at = v_now, email = NULL, account = v_account, token_id = v_token
                WHERE r.id = v_request.id;
            END IF;
        END LOOP;
    END IF;
    -- issued requests leave once out of every window of the policy (a batch per call); looked for
    -- first, so a call with none writes nothing (on Citus the table is on the coordinator, and a
    -- write there, even of no row, makes the dequeue's commit a two-phase one; issue 46)
    PERFORM 1 FROM mailroom.recovery_requests AS x
    WHERE x.token_id IS NOT NULL AND x.handled_at < v_now - interval '2 days'
    LIMIT 1;
    IF FOUND THEN
        DELETE FROM mailroom.recovery_requests AS r
        WHERE r.id IN (
            SELECT x.id FROM mailroom.recovery_requests AS x
            WHERE x.token_id IS NOT NULL AND x.handled_at < v_now - interval '2 days'
            ORDER BY x.handled_at
            LIMIT 1000
            FOR UPDATE SKIP LOCKED
        );
    END IF;
    RETURN v_issued;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._issue_requested_recoveries(integer) IS
'Internal: handle up to p_limit pending recovery requests (a token where the address is an active account and the recovery policy allows); returns the tokens issued. Called by dequeue_tokens.';
