-- Password recovery requests: rate-limited per account, and the same answer
-- and comparable work whether or not the address belongs to an active account.

CREATE OR REPLACE FUNCTION mailroom.request_password_recovery(p_email text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ts timestamptz := mailroom.clock();
    v_min_interval interval := mailroom.setting('recovery.min_interval')::interval;
    v_daily_cap integer := mailroom.setting('recovery.daily_cap')::integer;
    v_account bigint;
    v_status mailroom.account_status;
    v_recent integer;
    v_last timestamptz;
    v_secret bytea;
    v_code text;
BEGIN
    IF mailroom._valid_email(p_email) IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = 'MR101', MESSAGE = 'invalid email address';
    END IF;
    -- serialise requests for one address (existing or not) so the rate
    -- limit cannot be raced; no row lock, which only existing rows would get
    PERFORM pg_advisory_xact_lock(hashtextextended('mailroom.recovery:' || lower(p_email), 0));

    SELECT a.id, a.status INTO v_account, v_status
    FROM mailroom.accounts AS a
    WHERE lower(a.email) = lower(p_email);

    SELECT count(*), max(t.created_at) INTO v_recent, v_last
    FROM mailroom.tokens AS t
    WHERE t.account = coalesce(v_account, 0)
        AND t.action = 'password_recovery'
        AND t.created_at > v_ts - interval '1 day';

    v_secret := mailroom._random_bytes(32);
    v_code := mailroom._random_code();

    IF v_status = 'active'
        AND v_recent < v_daily_cap
        AND (v_last IS NULL OR v_last <= v_ts - v_min_interval) THEN
        INSERT INTO mailroom.tokens (account, action, secret, code)
        VALUES (v_account, 'password_recovery', v_secret, v_code);
    ELSE
        -- the work the insert would have done: some WAL (an empty
        -- transactional message, so COMMIT waits for a flush as it does
        -- after an insert), the digests and the revocation probe
        PERFORM pg_logical_emit_message(true, 'mailroom.recovery', '');
        PERFORM
            mailroom._digest(v_secret, 'sha256'),
            mailroom._digest(v_secret || convert_to(v_code, 'UTF8'), 'sha256');
        PERFORM 1
        FROM mailroom.tokens AS t
        WHERE t.account = coalesce(v_account, 0)
            AND t.action = 'password_recovery'
            AND t.consumed_at IS NULL
            AND t.revoked_at IS NULL;
        -- the settings the token triggers read, and the foreign-key probe
        PERFORM
            v_ts + mailroom.setting('tokens.ttl')::interval,
            mailroom.setting('tokens.channel');
        PERFORM 1 FROM mailroom.accounts AS a WHERE a.id = coalesce(v_account, 0);
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom.request_password_recovery(text) IS
'Issue a password-recovery token if the address is an active account within the rate limits (recovery.min_interval, recovery.daily_cap); same void result otherwise. Errors: MR101 not an email address.';

GRANT EXECUTE ON FUNCTION mailroom.request_password_recovery(text) TO mailroom_app;
