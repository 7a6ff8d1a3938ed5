-- Mailboxes: create, extend, soft delete, authorize, and the RCPT-stage acceptance check.
-- Error codes (docs/inboxes.md): MR201 unknown plan, MR202 bad TTL/minutes, MR203 not found,
-- MR204 not authorized, MR205 expired, MR206 deleted, MR210 bad owner.

-- PL/pgSQL, not SQL, on the hot paths (RCPT, delivery): a SQL function with SET search_path is
-- never inlined and is parsed and planned again at every statement that calls it (~25 us each),
-- while a PL/pgSQL one keeps its compiled form for the session.
CREATE OR REPLACE FUNCTION mailroom_internal._normalize_address(p_address text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN lower(btrim(btrim(p_address), '<>'));
END;
$$;

COMMENT ON FUNCTION mailroom_internal._normalize_address(text) IS
'Internal: the stored form of an address (trimmed, angle brackets removed, lower case).';

CREATE OR REPLACE FUNCTION mailroom_internal._session_token_digest(p_token text)
RETURNS bytea
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailroom_internal._digest(convert_to(p_token, 'UTF8'), 'sha256')
$$;

COMMENT ON FUNCTION mailroom_internal._session_token_digest(text) IS
'Internal: sha256 of a session token, the only form in which tokens are stored.';

CREATE OR REPLACE FUNCTION mailroom_internal._mailbox_open(
    p_is_active boolean, p_deleted_at timestamptz, p_expires_at timestamptz, p_at timestamptz
)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A mailbox is open (accepts mail, may be read and extended) while it is active, not
    -- deleted and p_at is before its expires_at: at the expiry instant it is closed, whether or
    -- not the expiry sweep has flipped is_active yet. For a row already found by another index
    -- (address, id, owner); the sweep's due-query keeps its own index condition. IMMUTABLE (the
    -- time is an argument) and by columns, not the row: a statement on a table in Citus'
    -- metadata may call it with column references (a whole row there is of the shard's type;
    -- docs/scale.md). PL/pgSQL for the reason given at _normalize_address.
    RETURN p_is_active AND p_deleted_at IS NULL AND p_expires_at > p_at;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._mailbox_open(boolean, timestamptz, timestamptz, timestamptz) IS
'Internal: whether a mailbox with these is_active, deleted_at and expires_at is open at p_at (active, not deleted, expires_at after p_at): the one rule for "open".';

CREATE OR REPLACE FUNCTION mailroom_internal._mailbox_open(p_box mailroom.mailboxes)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom_internal._mailbox_open(p_box.is_active, p_box.deleted_at, p_box.expires_at, mailroom.clock());
END;
$$;

COMMENT ON FUNCTION mailroom_internal._mailbox_open(mailroom.mailboxes) IS
'Internal: whether a mailbox row is open now, at mailroom.clock() (the four-argument form).';

-- Lookup by address, and the insert that keeps an address unique: on a single node both are the
-- unique key mailboxes_address_key. On a Citus coordinator mailboxes are distributed by id, where
-- that key cannot be enforced: sql/citus/30_mailboxes.sql replaces these two with a table keyed
-- (and distributed) by address, mailbox_addresses (docs/scale.md). Every function finds a mailbox
-- by its id, through _mailbox_id: on Citus one single-shard read, then single-shard work.
CREATE OR REPLACE FUNCTION mailroom_internal._mailbox_id(p_address text)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- p_address in its stored form (_normalize_address); NULL when no mailbox has it
    RETURN (SELECT m.id FROM mailroom.mailboxes AS m WHERE m.address = p_address);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._mailbox_id(text) IS
'Internal: the id of the mailbox with this (normalized) address, NULL if none (on Citus: through mailbox_addresses).';

-- Its Citus form: sql/citus/30_mailboxes.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._insert_mailbox(
    p_address text,
    p_plan text,
    p_owner_type mailroom.mailbox_owner_type,
    p_owner_id text,
    p_session_token_digest bytea,
    p_expires_at timestamptz,
    p_created_at timestamptz,
    p_catchall_domain text DEFAULT null
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    -- the new mailbox's id, or NULL when the address is taken (ON CONFLICT on the address)
    INSERT INTO mailroom.mailboxes AS m (
        address, plan, owner_type, owner_id, session_token_digest, expires_at, created_at, catchall_domain
    )
    VALUES (
        p_address, p_plan, p_owner_type, p_owner_id, p_session_token_digest, p_expires_at, p_created_at,
        p_catchall_domain
    )
    ON CONFLICT (address) DO NOTHING
    RETURNING m.id INTO v_id;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._insert_mailbox(
    text, text, mailroom.mailbox_owner_type, text, bytea, timestamptz, timestamptz, text
) IS
'Internal: insert a mailbox unless its (normalized) address is taken: its id, or NULL (on Citus: the address reserved in mailbox_addresses first).';

-- Its Citus form: sql/citus/30_mailboxes.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._delete_mailbox(p_address text)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    -- the mailbox of this (normalized) address, and its messages (trigger after_mailboxes_deleted);
    -- how many mailboxes (0 or 1). On Citus also its messages and its address (sql/citus/30).
    DELETE FROM mailroom.mailboxes AS m WHERE m.address = p_address;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_mailbox(text) IS
'Internal: delete the mailbox of this (normalized) address with its messages (on Citus: and free its address in mailbox_addresses); how many (0 or 1).';

CREATE OR REPLACE FUNCTION mailroom.create_mailbox(
    p_ttl_minutes integer DEFAULT null,
    p_plan text DEFAULT 'free',
    p_owner_type text DEFAULT 'anonymous',
    p_owner_id text DEFAULT null
)
RETURNS TABLE (
    mailbox_id bigint,
    address text,
    expires_at timestamptz,
    session_token text
)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_plan mailroom.plans;
    v_owner_type text := coalesce(p_owner_type, 'anonymous');
    v_owner_id text := nullif(btrim(p_owner_id), '');
    v_now timestamptz := mailroom.clock();
    v_domain text := lower(btrim(mailroom.setting('inbox.domain')));
    v_token text;
    v_ttl integer;
    v_attempt integer := 0;
    v_address text;
    v_id bigint;
BEGIN
    SELECT * INTO v_plan FROM mailroom.plans AS p WHERE p.name = coalesce(p_plan, 'free');
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR201',
            MESSAGE = format('unknown plan %L', p_plan),
            HINT = 'SELECT name FROM mailroom.list_plans() lists the plans';
    END IF;
    IF p_ttl_minutes IS NOT NULL AND p_ttl_minutes <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR202',
            MESSAGE = format('TTL must be a positive number of minutes, got %s', p_ttl_minutes);
    END IF;
    IF v_owner_type NOT IN ('anonymous', 'api', 'mcp') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR210',
            MESSAGE = format('unknown owner type %L (anonymous, api or mcp)', v_owner_type);
    END IF;
    IF v_owner_type = 'anonymous' AND v_owner_id IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR210',
            MESSAGE = 'an anonymous mailbox has no owner id (it is authorized by its session token)';
    END IF;
    IF v_owner_type <> 'anonymous' AND v_owner_id IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR210',
            MESSAGE = format('a mailbox owned by %s needs an owner id', v_owner_type);
    END IF;

    v_ttl := least(coalesce(p_ttl_minutes, v_plan.default_ttl_minutes), v_plan.max_ttl_minutes);
    IF p_ttl_minutes > v_plan.max_ttl_minutes THEN
        RAISE NOTICE USING
            MESSAGE = format('TTL clamped to %s minutes, the most the %s plan allows (asked for %s)',
                v_plan.max_ttl_minutes, v_plan.name, p_ttl_minutes);
    END IF;
    IF v_owner_type = 'anonymous' THEN
        -- 24 random bytes, URL-safe base64 without padding (32 characters).
        v_token := rtrim(translate(encode(mailroom_internal._random_bytes(24), 'base64'), '+/', '-_'), '=');
    END IF;

    LOOP
        -- 10 random bytes = 80 bits in the local part: addresses cannot be guessed.
        v_address := encode(mailroom_internal._random_bytes(10), 'hex') || '@' || v_domain;
        v_id := mailroom_internal._insert_mailbox(
            v_address, v_plan.name, v_owner_type::mailroom.mailbox_owner_type, v_owner_id,
            mailroom_internal._session_token_digest(v_token), v_now + make_interval(mins => v_ttl), v_now
        );
        IF v_id IS NOT NULL THEN
            mailbox_id := v_id;
            address := v_address;
            expires_at := v_now + make_interval(mins => v_ttl);
            session_token := v_token;
            RETURN NEXT;
        END IF;
        EXIT WHEN v_id IS NOT NULL;
        v_attempt := v_attempt + 1;
        IF v_attempt >= 5 THEN
            RAISE EXCEPTION USING
                ERRCODE = '23505',
                MESSAGE = 'could not generate a unique mailbox address';
        END IF;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION mailroom.create_mailbox(integer, text, text, text) IS
'Create an inbox: TTL = min(requested or plan default, plan max); returns id, address, expires_at and (anonymous only) the session token. Errors: MR201 unknown plan, MR202 bad TTL, MR210 bad owner.';

GRANT EXECUTE ON FUNCTION mailroom.create_mailbox(integer, text, text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom_internal._authorize_mailbox(
    p_address text,
    p_session_token text,
    p_owner_type text,
    p_owner_id text,
    p_require_open boolean DEFAULT true
)
RETURNS mailroom.mailboxes
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes;
    v_id bigint;
BEGIN
    -- by id, found by address (_mailbox_id): on Citus two single-shard reads (the id in a
    -- variable: a function reading a distributed table inside a distributed statement would be
    -- a nested distributed query)
    v_id := mailroom_internal._mailbox_id(mailroom_internal._normalize_address(p_address));
    SELECT * INTO v_box
    FROM mailroom.mailboxes AS m
    WHERE m.id = v_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MR203', MESSAGE = 'mailbox not found';
    END IF;
    IF NOT (
        (
            v_box.session_token_digest IS NOT NULL
            AND p_session_token IS NOT NULL
            AND v_box.session_token_digest = mailroom_internal._session_token_digest(p_session_token)
        )
        OR (
            v_box.owner_id IS NOT NULL
            AND p_owner_id IS NOT NULL
            AND v_box.owner_type::text = p_owner_type
            AND v_box.owner_id = p_owner_id
        )
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR204',
            MESSAGE = 'not authorized for this mailbox (wrong session token or owner)';
    END IF;
    IF p_require_open THEN
        IF v_box.deleted_at IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR206',
                MESSAGE = format('mailbox was deleted at %s', v_box.deleted_at);
        END IF;
        IF NOT mailroom_internal._mailbox_open(v_box) THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR205',
                MESSAGE = format('mailbox expired at %s', v_box.expires_at);
        END IF;
    END IF;
    RETURN v_box;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._authorize_mailbox(text, text, text, text, boolean) IS
'Internal: the mailbox row if the caller holds its session token or owns it (MR203/MR204), and it is open (MR205/MR206).';

CREATE OR REPLACE FUNCTION mailroom.extend_mailbox(
    p_address text,
    p_session_token text,
    p_minutes integer,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes;
    v_expires timestamptz;
BEGIN
    IF p_minutes IS NULL OR p_minutes <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR202',
            MESSAGE = format('extension must be a positive number of minutes, got %s',
                coalesce(p_minutes::text, 'NULL'));
    END IF;
    v_box := mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id);
    -- New expiry: later by p_minutes, but never more than the plan's max TTL from now,
    -- and never earlier than it already is. The guard is re-checked under the row lock.
    UPDATE mailroom.mailboxes AS m
    SET expires_at = greatest(
        m.expires_at,
        least(
            m.expires_at + make_interval(mins => p_minutes),
            mailroom.clock() + make_interval(mins => p.max_ttl_minutes)
        )
    )
    FROM mailroom.plans AS p
    WHERE
        m.id = v_box.id
        AND p.name = m.plan
        AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, mailroom.clock())
    RETURNING m.expires_at INTO v_expires;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR205',
            MESSAGE = format('mailbox expired at %s', v_box.expires_at);
    END IF;
    RETURN v_expires;
END;
$$;

COMMENT ON FUNCTION mailroom.extend_mailbox(text, text, integer, text, text) IS
'Push an open mailbox''s expiry later by p_minutes, capped at now + the plan''s max TTL; returns the new expires_at. Errors: MR202 bad minutes, MR203-MR206 as the mailbox''s state.';

GRANT EXECUTE ON FUNCTION mailroom.extend_mailbox(text, text, integer, text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.delete_mailbox(
    p_address text,
    p_session_token text,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes;
BEGIN
    v_box := mailroom_internal._authorize_mailbox(
        p_address, p_session_token, p_owner_type, p_owner_id, p_require_open => false
    );
    UPDATE mailroom.mailboxes AS m
    SET
        is_active = false,
        deleted_at = mailroom.clock(),
        inactive_since = coalesce(m.inactive_since, least(m.expires_at, mailroom.clock()))
    WHERE m.id = v_box.id AND m.deleted_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- the delete announces itself where mail is announced (ids only), so a wait on the inbox ends
    -- at once (MR206) instead of at its timeout (docs/architecture.md, "The wait")
    PERFORM mailroom_internal._notify_each(
        ARRAY['mailroom_inbox'], json_build_object('mailbox_id', v_box.id, 'deleted', true)::text
    );
    RETURN true;
END;
$$;

COMMENT ON FUNCTION mailroom.delete_mailbox(text, text, text, text) IS
'Soft-delete a mailbox (stops accepting mail at once; purge removes it later; NOTIFY mailroom_inbox {mailbox_id, deleted} where someone listens, which ends its waits); false if it was already deleted.';

GRANT EXECUTE ON FUNCTION mailroom.delete_mailbox(text, text, text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.check_recipient(
    p_address text,
    p_size bigint DEFAULT null
)
RETURNS TABLE (verdict text, address text)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_box mailroom.mailboxes;
    v_plan mailroom.plans;
    v_id bigint;
BEGIN
    -- One row: the verdict and the address in its stored form, so an SMTP server de-duplicates
    -- recipients by the same normalization the mailboxes are keyed on. PL/pgSQL (plans kept for
    -- the session): it runs at every RCPT, where a SQL function was parsed and planned each time.
    -- A plus address is its box's (box+tag@domain: box@domain, sql/02_addresses.sql): the address
    -- answered is the box's, so a server stores one copy per box however its tags were written.
    -- (the call only for an address with a '+': a function call with SET search_path is not free)
    address := mailroom_internal._normalize_address(p_address);
    IF strpos(address, '+') > 0 THEN
        address := mailroom_internal._address_base(address);
    END IF;
    v_id := mailroom_internal._mailbox_id(check_recipient.address);
    SELECT m.* INTO v_box FROM mailroom.mailboxes AS m WHERE m.id = v_id;
    IF v_box.id IS NULL THEN
        verdict := 'unknown';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT p.* INTO v_plan FROM mailroom.plans AS p WHERE p.name = v_box.plan;
    verdict := CASE
        WHEN v_box.deleted_at IS NOT NULL THEN 'deleted'
        WHEN NOT mailroom_internal._mailbox_open(v_box) THEN 'expired'
        WHEN p_size IS NOT NULL AND p_size > v_plan.max_message_bytes THEN 'too_large'
        WHEN v_box.message_count >= v_plan.max_messages AND v_plan.when_full = 'refuse' THEN 'full'
        ELSE 'ok'
    END;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.check_recipient(text, bigint) IS
'RCPT-stage verdict for an address (and declared size): ok, unknown, deleted, expired, too_large or full (a plan that lets the oldest go is never full), with the normalized address, a plus address as its box''s (de-duplicate recipients by it).';

GRANT EXECUTE ON FUNCTION mailroom.check_recipient(text, bigint) TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom.mailbox_accepts(
    p_address text,
    p_size bigint DEFAULT null
)
RETURNS boolean
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.verdict = 'ok' FROM mailroom.check_recipient(p_address, p_size) AS c
$$;

COMMENT ON FUNCTION mailroom.mailbox_accepts(text, bigint) IS
'Whether mail for this address (of this size, if given) is accepted now: active, unexpired, under the plan limits.';

GRANT EXECUTE ON FUNCTION mailroom.mailbox_accepts(text, bigint) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.max_inbound_message_bytes()
RETURNS integer
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(max(p.max_message_bytes), 0) FROM mailroom.plans AS p
$$;

COMMENT ON FUNCTION mailroom.max_inbound_message_bytes() IS
'Largest message any plan accepts: the SIZE the inbound SMTP server advertises.';

GRANT EXECUTE ON FUNCTION mailroom.max_inbound_message_bytes() TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom.list_mailboxes(
    p_owner_type text,
    p_owner_id text,
    p_include_closed boolean DEFAULT false
)
RETURNS TABLE (
    mailbox_id bigint,
    address text,
    plan text,
    expires_at timestamptz,
    is_open boolean,
    message_count integer,
    created_at timestamptz
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT
        m.id,
        m.address,
        m.plan,
        m.expires_at,
        mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, mailroom.clock()),
        m.message_count,
        m.created_at
    FROM mailroom.mailboxes AS m
    WHERE
        m.owner_type::text = p_owner_type
        AND m.owner_id = p_owner_id
        AND m.owner_id IS NOT NULL
        AND (p_include_closed OR mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, mailroom.clock()))
    ORDER BY m.created_at, m.id
$$;

COMMENT ON FUNCTION mailroom.list_mailboxes(text, text, boolean) IS
'Mailboxes of an api/mcp owner, oldest first: open ones only unless p_include_closed (expired or deleted, not yet purged).';

GRANT EXECUTE ON FUNCTION mailroom.list_mailboxes(text, text, boolean) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.list_plans()
RETURNS TABLE (
    name text,
    default_ttl_minutes integer,
    max_ttl_minutes integer,
    max_message_bytes integer,
    max_messages integer,
    when_full text
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p.name, p.default_ttl_minutes, p.max_ttl_minutes, p.max_message_bytes, p.max_messages, p.when_full
    FROM mailroom.plans AS p
    ORDER BY p.max_ttl_minutes, p.name
$$;

COMMENT ON FUNCTION mailroom.list_plans() IS
'The mailbox plans create_mailbox accepts: TTL default and ceiling (minutes), largest message (bytes), messages kept, and what a full inbox does (when_full: refuse, or drop_oldest).';

GRANT EXECUTE ON FUNCTION mailroom.list_plans() TO mailroom_app, mailroom_monitor, mailroom_admin;
