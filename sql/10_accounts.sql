-- Accounts: validation, lifecycle triggers, create / suspend / unsuspend.
-- Every timestamp comes from mailroom.clock(). A plain INSERT or
-- UPDATE ... SET status = ... from psql goes through the same triggers as
-- the functions below, so both behave the same.

CREATE OR REPLACE FUNCTION mailroom_internal._valid_email(p_email text)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the shared address rule (so every account email is sendable), plus a dotted domain;
    -- PL/pgSQL for the reason given at mailroom_internal._is_valid_address (it runs at every account insert)
    RETURN coalesce(
        mailroom_internal._is_valid_address(p_email) AND split_part(p_email, '@', 2) LIKE '%.%',
        FALSE
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._valid_email(text) IS
'Internal: true when the text is a plausible mailbox address (local@domain.tld, at most 254 characters).';

CREATE OR REPLACE FUNCTION mailroom_internal._check_account_identity(p_email text, p_login text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF mailroom_internal._valid_email(p_email) IS NOT TRUE THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR101',
            MESSAGE = 'invalid email address',
            HINT = 'Expected local@domain.tld, at most 254 characters, no spaces.';
    END IF;
    IF p_login IS NULL
        OR char_length(p_login) NOT BETWEEN 1 AND 254
        OR p_login !~ '^[[:graph:]]([[:print:]]*[[:graph:]])?$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR104',
            MESSAGE = 'invalid login',
            HINT = 'Expected 1 to 254 printable characters, without leading or trailing spaces.';
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._check_account_identity(text, text) IS
'Internal: raise MR101 (bad email) or MR104 (bad login).';

-- A Citus seam (mailroom.db.citus.SEAMS): whether row triggers write other tables. True on one
-- node; false on Citus (sql/citus/12_accounts.sql), where a row trigger runs on a worker, on the
-- shard of its row: there the functions do that work on the coordinator (create_account's
-- _insert_account makes the activation token, _issue_token revokes a reissue's older tokens).
CREATE OR REPLACE FUNCTION mailroom_internal._triggers_cascade()
RETURNS boolean
LANGUAGE plpgsql
STABLE  -- not IMMUTABLE: never folded into a cached plan, so the Citus form takes over at once
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN true;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._triggers_cascade() IS
'Internal (a Citus seam): whether row triggers write other tables (true on one node, false on Citus).';

-- 1. Before account insert: validate, stamp, create the activation token (one node: on Citus,
--    _triggers_cascade() is false and create_account makes it).
--    NEW.id is already assigned (identity default) in a BEFORE trigger; the
--    token's foreign key is deferred, so the token row can precede its account.
CREATE OR REPLACE FUNCTION mailroom_internal.trg_before_account_insert()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ts timestamptz := mailroom.clock();
BEGIN
    PERFORM mailroom_internal._check_account_identity(NEW.email, NEW.login);
    NEW.created_at := coalesce(NEW.created_at, ts);
    IF NEW.status = 'active' THEN
        NEW.activated_at := coalesce(NEW.activated_at, ts);
    ELSIF NEW.status = 'suspended' THEN
        NEW.suspended_at := coalesce(NEW.suspended_at, ts);
    END IF;
    IF NEW.status = 'provisioned' AND mailroom_internal._triggers_cascade() THEN
        -- created with its account, at the same instant (no second reading of the clock)
        INSERT INTO mailroom.tokens (account, action, created_at) VALUES (NEW.id, 'activation', ts);
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_before_account_insert() IS
'Trigger: validate email/login, stamp created_at, insert the activation token of a provisioned account.';

CREATE OR REPLACE TRIGGER before_account_insert
BEFORE INSERT ON mailroom.accounts
FOR EACH ROW
EXECUTE FUNCTION mailroom_internal.trg_before_account_insert();

CREATE OR REPLACE FUNCTION mailroom_internal.trg_before_account_identity_change()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM mailroom_internal._check_account_identity(NEW.email, NEW.login);
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_before_account_identity_change() IS
'Trigger: validate email and login when they are updated.';

CREATE OR REPLACE TRIGGER before_account_identity_change
BEFORE UPDATE OF email, login ON mailroom.accounts
FOR EACH ROW
EXECUTE FUNCTION mailroom_internal.trg_before_account_identity_change();

-- 2. Before account status change: lifecycle timestamps.
--    provisioned -> active     activated_at (first activation only)
--    * -> suspended            suspended_at = now, unsuspended_at cleared
--    suspended -> active       unsuspended_at = now, suspended_at cleared,
--                              back to provisioned if never activated
--    suspended -> provisioned  same as above when never activated
--    active -> provisioned     refused (MR108)
CREATE OR REPLACE FUNCTION mailroom_internal.trg_before_account_status_change()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ts timestamptz;
BEGIN
    IF NEW.status = OLD.status THEN
        RETURN NEW;
    END IF;
    -- the time of the change: what the statement stamped in status_changed_at (the API functions
    -- stamp mailroom.clock() there; on Citus this trigger runs on a worker, whose clock is not the
    -- caller's: the coordinator evaluates the statement's clock() and sends the value), else now
    ts := CASE
        WHEN NEW.status_changed_at IS DISTINCT FROM OLD.status_changed_at THEN NEW.status_changed_at
        ELSE mailroom.clock()
    END;
    IF OLD.status = 'suspended' THEN
        IF NEW.status = 'provisioned' AND OLD.activated_at IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR108',
                MESSAGE = format('invalid status transition for account %s: an activated account '
                    || 'cannot return to provisioned', OLD.id);
        END IF;
        NEW.unsuspended_at := ts;
        NEW.suspended_at := NULL;
        IF OLD.activated_at IS NULL THEN
            NEW.status := 'provisioned';
        END IF;
    ELSIF NEW.status = 'suspended' THEN
        NEW.suspended_at := ts;
        NEW.unsuspended_at := NULL;
    ELSIF NEW.status = 'active' THEN
        NEW.activated_at := coalesce(OLD.activated_at, ts);
    ELSE
        RAISE EXCEPTION USING
            ERRCODE = 'MR108',
            MESSAGE = format('invalid status transition for account %s: active to provisioned', OLD.id);
    END IF;
    NEW.status_changed_at := ts;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_before_account_status_change() IS
'Trigger: maintain status_changed_at/activated_at/suspended_at/unsuspended_at; unsuspend reverts to provisioned if never activated.';

CREATE OR REPLACE TRIGGER before_account_status_change
BEFORE UPDATE OF status ON mailroom.accounts
FOR EACH ROW
EXECUTE FUNCTION mailroom_internal.trg_before_account_status_change();

-- A Citus seam (mailroom.db.citus.SEAMS): the insert of create_account. On one node the account
-- row (its BEFORE trigger validates it and makes the activation token); on Citus
-- (sql/citus/12_accounts.sql) the unique keys reserved in their lookup tables first, then the row
-- and its token. Either way: the new id, or no id and the key another account holds.
CREATE OR REPLACE FUNCTION mailroom_internal._insert_account(p_email text, p_login text, OUT id bigint, OUT taken text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO mailroom.accounts AS a (email, login) VALUES (p_email, p_login)
    ON CONFLICT DO NOTHING
    RETURNING a.id INTO id;
    IF id IS NULL THEN
        taken := CASE
            WHEN EXISTS (SELECT FROM mailroom.accounts AS a WHERE lower(a.email) = lower(p_email)) THEN 'email'
            WHEN EXISTS (SELECT FROM mailroom.accounts AS a WHERE a.login = p_login) THEN 'login'
        END;
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._insert_account(text, text) IS
'Internal (a Citus seam): insert an account (and its activation token); (its id, NULL), or (NULL, the key taken: email, login, or NULL when the holder was deleted meanwhile).';

CREATE OR REPLACE FUNCTION mailroom.create_account(p_email text, p_login text)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_taken text;
BEGIN
    -- ON CONFLICT DO NOTHING rather than an EXCEPTION block: no subtransaction a call. A row that
    -- conflicts is skipped (after waiting for a concurrent insert of the same key to end), then
    -- the key it met is named; the activation token its BEFORE trigger made is rolled back with
    -- the error (always raised then: the token must not outlive its account's failed insert).
    SELECT i.id, i.taken INTO v_id, v_taken FROM mailroom_internal._insert_account(p_email, p_login) AS i;
    IF v_id IS NOT NULL THEN
        RETURN v_id;
    END IF;
    IF v_taken = 'email' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR102',
            MESSAGE = 'an account with this email address already exists';
    ELSIF v_taken = 'login' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR103',
            MESSAGE = 'an account with this login already exists';
    END IF;
    -- the account it conflicted with was deleted in between: the caller may simply retry
    RAISE EXCEPTION USING
        ERRCODE = '40001',
        MESSAGE = 'the account conflicted with one deleted concurrently; retry';
END;
$$;

COMMENT ON FUNCTION mailroom.create_account(text, text) IS
'Create a provisioned account and its activation token; returns the account id (MR101 bad email, MR102 email taken, MR103 login taken, MR104 bad login).';

GRANT EXECUTE ON FUNCTION mailroom.create_account(text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom_internal._lock_account(p_account bigint)
RETURNS mailroom.account_status
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_status mailroom.account_status;
BEGIN
    SELECT a.status INTO v_status
    FROM mailroom.accounts AS a
    WHERE a.id = p_account
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR105',
            MESSAGE = format('unknown account %s', coalesce(p_account::text, 'NULL'));
    END IF;
    RETURN v_status;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._lock_account(bigint) IS
'Internal: lock an account row and return its status (MR105 if it does not exist).';

CREATE OR REPLACE FUNCTION mailroom.suspend_account(p_account bigint)
RETURNS mailroom.account_status
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_status mailroom.account_status;
BEGIN
    IF mailroom_internal._lock_account(p_account) = 'suspended' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR106',
            MESSAGE = format('account %s is already suspended', p_account);
    END IF;
    UPDATE mailroom.accounts SET status = 'suspended', status_changed_at = mailroom.clock()
    WHERE id = p_account
    RETURNING status INTO v_status;
    RETURN v_status;
END;
$$;

COMMENT ON FUNCTION mailroom.suspend_account(bigint) IS
'Suspend an account (sets suspended_at, clears unsuspended_at); returns the new status (MR105 unknown, MR106 already suspended).';

GRANT EXECUTE ON FUNCTION mailroom.suspend_account(bigint) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.unsuspend_account(p_account bigint)
RETURNS mailroom.account_status
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_status mailroom.account_status;
BEGIN
    IF mailroom_internal._lock_account(p_account) <> 'suspended' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR107',
            MESSAGE = format('account %s is not suspended', p_account);
    END IF;
    UPDATE mailroom.accounts SET status = 'active', status_changed_at = mailroom.clock()
    WHERE id = p_account
    RETURNING status INTO v_status;
    RETURN v_status;
END;
$$;

COMMENT ON FUNCTION mailroom.unsuspend_account(bigint) IS
'Lift a suspension: back to active, or to provisioned if never activated; returns the new status (MR105 unknown, MR107 not suspended).';

GRANT EXECUTE ON FUNCTION mailroom.unsuspend_account(bigint) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.account_status(p_account bigint)
RETURNS mailroom.account_status
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_status mailroom.account_status;
BEGIN
    SELECT a.status INTO v_status FROM mailroom.accounts AS a WHERE a.id = p_account;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR105',
            MESSAGE = format('unknown account %s', coalesce(p_account::text, 'NULL'));
    END IF;
    RETURN v_status;
END;
$$;

COMMENT ON FUNCTION mailroom.account_status(bigint) IS
'The status of an account: provisioned, active or suspended (MR105 unknown).';

GRANT EXECUTE ON FUNCTION mailroom.account_status(bigint) TO mailroom_app;

-- The account of an address, its row locked (FOR NO KEY UPDATE), for the recovery policy
-- (sql/13). A function of its own: on Citus the address is found through account_emails, then
-- the account row is locked on its shard (sql/citus/12).
-- Its Citus form: sql/citus/12_accounts.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._lock_account_by_email(p_email_lower text)
RETURNS TABLE (id bigint, status mailroom.account_status)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT a.id, a.status
    FROM mailroom.accounts AS a
    WHERE lower(a.email) = p_email_lower
    FOR NO KEY UPDATE;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._lock_account_by_email(text) IS
'Internal: the account whose lower(email) is p_email_lower and its status, its row locked FOR NO KEY UPDATE (no row: none).';

CREATE OR REPLACE FUNCTION mailroom.list_accounts(
    p_account bigint DEFAULT null,
    p_email text DEFAULT null,
    p_status mailroom.account_status DEFAULT null,
    p_limit integer DEFAULT 100,
    p_after bigint DEFAULT null
)
RETURNS TABLE (
    id bigint,
    email text,
    login text,
    status mailroom.account_status,
    created_at timestamptz,
    activated_at timestamptz,
    suspended_at timestamptz,
    status_changed_at timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- `mailroom account list / show` (admin: addresses are PII). One account by id or address (any
    -- case), or a page in id order: p_after is the last id of the previous page (keyset, no OFFSET).
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'list_accounts: the limit must be between 1 and 10000';
    END IF;
    RETURN QUERY
    SELECT a.id, a.email, a.login, a.status, a.created_at, a.activated_at, a.suspended_at, a.status_changed_at
    FROM mailroom.accounts AS a
    WHERE
        (p_account IS NULL OR a.id = p_account)
        AND (p_email IS NULL OR lower(a.email) = lower(p_email))
        AND (p_status IS NULL OR a.status = p_status)
        AND (p_after IS NULL OR a.id > p_after)
    ORDER BY a.id
    LIMIT p_limit;
END;
$$;

COMMENT ON FUNCTION mailroom.list_accounts(bigint, text, mailroom.account_status, integer, bigint) IS
'Accounts (id, email, login, status, times) in id order: one by id or address, or a page (p_after: the last id seen) '
'filtered by status; at most p_limit (1 to 10000, else 22023). Admin: addresses are PII.';

GRANT EXECUTE ON FUNCTION mailroom.list_accounts(bigint, text, mailroom.account_status, integer, bigint)
TO mailroom_admin;
