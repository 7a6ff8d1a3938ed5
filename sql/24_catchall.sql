-- Catch-all inbox domains (docs/http.md): the first RCPT to an unknown address on a catch-all
-- domain creates its inbox, under the domain's plan and owner (owner type api: an API key of that
-- owner reads it), within the domain's quota of open inboxes, in the same call as the RCPT check
-- (check_bounce_recipient in sql/26_bounces.sql, and deliver_ses_message in sql/29_ses.sql).
-- Off by default: no domain is catch-all until an admin sets one. A domain may be a subdomain pattern
-- (*.example.com: every subdomain of example.com, not example.com itself); '*' is the sink's (plan sink,
-- anonymous; setting inbox.sink or `inbox serve --sink`), never a catch-all row.
-- Errors: MR201 unknown plan, MR202 bad TTL, MR210 bad owner, MR245 bad domain or quota.

CREATE OR REPLACE FUNCTION mailroom_internal._sink_on(p_sink boolean)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the inbound server's --sink, else the database-wide setting (read only for an unknown address)
    RETURN coalesce(p_sink, false) OR mailroom.setting('inbox.sink')::boolean;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._sink_on(boolean) IS
'Internal: whether the sink takes unknown addresses: the inbound server''s --sink (p_sink) or the setting inbox.sink.';

CREATE OR REPLACE FUNCTION mailroom_internal._sink_let_go(p_keep bigint, p_new integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_max_inboxes bigint := mailroom.setting('sink.max_inboxes')::bigint;
    v_max_bytes bigint := mailroom.setting('sink.max_bytes')::bigint;
    v_ids bigint[];
    v_n integer;
BEGIN
    -- The sink's caps: with p_new more inboxes to come, let the oldest open sink inboxes go (expired
    -- now) until at most sink.max_inboxes are open and their stored bytes are at most sink.max_bytes;
    -- never p_keep (the inbox just written to). Oldest: by creation. A let-go inbox locked by another
    -- transaction is skipped (SKIP LOCKED: no wait, so no deadlock with a delivery holding its row);
    -- the next call catches up. How many were let go.
    v_ids := ARRAY(
        SELECT o.id
        FROM (
            SELECT
                m.id,
                row_number() OVER w AS k,
                sum(m.stored_bytes) OVER w - m.stored_bytes AS freed_before,
                count(*) OVER () AS n,
                sum(m.stored_bytes) OVER () AS total
            FROM mailroom.mailboxes AS m
            WHERE
                m.catchall_domain = '*' AND m.is_active
                AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, v_now)
                AND m.id IS DISTINCT FROM p_keep
            WINDOW w AS (ORDER BY m.created_at, m.id)
        ) AS o
        CROSS JOIN LATERAL (
            SELECT coalesce(sum(b.stored_bytes), 0) AS kept FROM mailroom.mailboxes AS b WHERE b.id = p_keep
        ) AS kb
        WHERE
            o.k <= o.n + (p_keep IS NOT NULL)::integer + p_new - v_max_inboxes
            OR o.total + kb.kept - o.freed_before > v_max_bytes
        ORDER BY o.k
    );
    IF cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;
    UPDATE mailroom.mailboxes AS m
    SET is_active = false, expires_at = least(m.expires_at, v_now), inactive_since = least(m.expires_at, v_now)
    WHERE m.id IN (
        SELECT l.id FROM mailroom.mailboxes AS l WHERE l.id = ANY(v_ids) AND l.is_active
        FOR UPDATE SKIP LOCKED
    );
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._sink_let_go(bigint, integer) IS
'Internal: let the oldest open sink inboxes go (expired now; never p_keep) until, with p_new more, at most sink.max_inboxes are open holding at most sink.max_bytes; how many.';

CREATE OR REPLACE FUNCTION mailroom_internal._check_recipient_or_claim(
    p_address text,
    p_size bigint DEFAULT null,
    p_sink boolean DEFAULT false
)
RETURNS TABLE (verdict text, address text)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    -- record, not mailroom.catchall_domains: sql/ must also compile where migration 0141 is not applied
    -- yet (tests/db/test_partitions.py applies it over the migrations before 0100)
    v_domain record;
    v_plan mailroom.plans;
    v_open integer;
    v_now timestamptz;
    v_host text;
    v_patterns text[];
BEGIN
    -- check_recipient's verdict; only an unknown address on a catch-all domain (or in the sink) goes
    -- further, so every other RCPT costs one primary-key probe more than check_recipient alone, at most.
    SELECT c.verdict, c.address INTO verdict, address FROM mailroom.check_recipient(p_address, p_size) AS c;
    IF verdict <> 'unknown' OR NOT mailroom_internal._is_valid_address(address) THEN
        RETURN NEXT;
        RETURN;
    END IF;
    -- the domain itself, else the most specific subdomain pattern (x.sub.example.com: *.sub.example.com,
    -- then *.example.com, then *.com; a pattern never covers the domain it names)
    v_host := split_part(address, '@', 2);
    v_patterns := ARRAY(
        SELECT '*.' || array_to_string((string_to_array(v_host, '.'))[i:], '.')
        FROM generate_series(2, cardinality(string_to_array(v_host, '.'))) AS i
    );
    -- the domain row is locked: creations on one domain take turns, so its quota is exact
    SELECT d.* INTO v_domain
    FROM mailroom.catchall_domains AS d
    WHERE d.domain = v_host OR d.domain = ANY(v_patterns)
    ORDER BY d.domain = v_host DESC, length(d.domain) DESC
    LIMIT 1
    FOR UPDATE;
    IF NOT FOUND THEN
        IF mailroom_internal._sink_on(p_sink) THEN
            RETURN QUERY SELECT s.verdict, s.address FROM mailroom_internal._sink_claim(p_address, p_size, address) AS s;
            RETURN;
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;
    v_now := mailroom.clock();
    SELECT count(*) INTO v_open
    FROM (
        SELECT 1 FROM mailroom.mailboxes AS m
        WHERE m.catchall_domain = v_domain.domain AND m.is_active AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, mailroom.clock())
        LIMIT v_domain.max_open
    ) AS o;
    IF v_open >= v_domain.max_open THEN
        -- over quota: the address stays unknown (550) until one of the domain's inboxes closes
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT p.* INTO v_plan FROM mailroom.plans AS p WHERE p.name = v_domain.plan;
    -- ON CONFLICT on the address (_insert_mailbox): a concurrent RCPT may have created it first
    PERFORM mailroom_internal._insert_mailbox(
        address, v_plan.name, 'api', v_domain.owner_id, NULL,
        v_now + make_interval(
            mins => least(coalesce(v_domain.ttl_minutes, v_plan.default_ttl_minutes), v_plan.max_ttl_minutes)
        ),
        v_now, v_domain.domain
    );
    -- the verdict of the inbox now there (a concurrent RCPT may have created it first)
    RETURN QUERY SELECT c.verdict, c.address FROM mailroom.check_recipient(p_address, p_size) AS c;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._check_recipient_or_claim(text, bigint, boolean) IS
'Internal: check_recipient''s verdict, after creating the inbox of an unknown address on a catch-all domain or subdomain pattern (within its quota), or in the sink (p_sink or inbox.sink).';

CREATE OR REPLACE FUNCTION mailroom_internal._sink_token(p_address text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- a sink inbox's session token: 24 bytes of HMAC-SHA256 of its address under mailroom.sink_key, as
    -- URL-safe base64 (32 characters, the form create_mailbox's tokens have); only its digest is stored
    RETURN rtrim(translate(encode(substring(
        mailroom_internal._hmac(
            convert_to('mailroom-sink-token:' || p_address, 'UTF8'),
            (SELECT k.key FROM mailroom.sink_key AS k), 'sha256'
        ) FROM 1 FOR 24
    ), 'base64'), '+/', '-_'), '=');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._sink_token(text) IS
'Internal: the session token of a sink inbox (HMAC of its address under mailroom.sink_key), handed out only by the sink listing.';

CREATE OR REPLACE FUNCTION mailroom_internal._sink_claim(p_address text, p_size bigint, p_box text)
RETURNS TABLE (verdict text, address text)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_plan mailroom.plans;
    v_now timestamptz;
BEGIN
    -- The sink's inbox of an unknown address (p_box: its stored form): plan sink, owner type anonymous
    -- with the session token _sink_token derives (handed out only by the sink listing, where the HTTP
    -- face serves it), marked catchall_domain '*'. Sink creations take turns (the row 'sink_claim' of
    -- mailroom.job_locks, waited for: no advisory lock, which any login could take), so sink.max_inboxes
    -- is exact; the oldest are let go first (_sink_let_go).
    PERFORM 1 FROM mailroom.job_locks AS j WHERE j.name = 'sink_claim' FOR UPDATE;
    v_now := mailroom.clock();
    SELECT p.* INTO v_plan FROM mailroom.plans AS p WHERE p.name = 'sink';
    IF mailroom_internal._mailbox_id(p_box) IS NULL THEN
        PERFORM mailroom_internal._sink_let_go(NULL, 1);
        PERFORM mailroom_internal._insert_mailbox(
            p_box, v_plan.name, 'anonymous', NULL,
            mailroom_internal._session_token_digest(mailroom_internal._sink_token(p_box)),
            v_now + make_interval(mins => v_plan.default_ttl_minutes), v_now, '*'
        );
    END IF;
    RETURN QUERY SELECT c.verdict, c.address FROM mailroom.check_recipient(p_address, p_size) AS c;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._sink_claim(text, bigint, text) IS
'Internal: create the sink''s inbox of an unknown address (plan sink, anonymous, catchall_domain *; the oldest let go past sink.max_inboxes or sink.max_bytes) and answer check_recipient''s verdict.';

CREATE OR REPLACE FUNCTION mailroom.set_catchall_domain(
    p_domain text,
    p_owner_id text,
    p_plan text DEFAULT 'free',
    p_max_open integer DEFAULT 100,
    p_ttl_minutes integer DEFAULT null
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_domain text := lower(btrim(p_domain));
BEGIN
    IF v_domain = '*' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR245',
            MESSAGE = 'every domain at once is the sink, not a catch-all domain',
            HINT = 'mailroom run --sink (or inbox serve --sink, or the setting inbox.sink) accepts every recipient';
    END IF;
    -- a domain name, or a subdomain pattern: *. then a domain name with at least two labels
    IF NOT coalesce(mailroom_internal._is_domain_name(v_domain), false)
        AND NOT (v_domain LIKE '*.%.%' AND coalesce(mailroom_internal._is_domain_name(substr(v_domain, 3)), false)) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR245',
            MESSAGE = 'a catch-all domain must be a domain name or a subdomain pattern (*.example.com)';
    END IF;
    IF p_max_open IS NULL OR p_max_open <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR245',
            MESSAGE = format('the quota of open inboxes must be positive, got %s', coalesce(p_max_open::text, 'NULL'));
    END IF;
    IF nullif(btrim(p_owner_id), '') IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR210',
            MESSAGE = 'a catch-all domain needs an owner id (its inboxes are owned by (api, owner id))';
    END IF;
    IF p_ttl_minutes IS NOT NULL AND p_ttl_minutes <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR202',
            MESSAGE = format('TTL must be a positive number of minutes, got %s', p_ttl_minutes);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM mailroom.plans AS p WHERE p.name = p_plan) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR201',
            MESSAGE = format('unknown plan %L', p_plan),
            HINT = 'SELECT name FROM mailroom.plans lists the plans';
    END IF;
    INSERT INTO mailroom.catchall_domains AS d (domain, owner_id, plan, ttl_minutes, max_open, created_at)
    VALUES (v_domain, btrim(p_owner_id), p_plan, p_ttl_minutes, p_max_open, mailroom.clock())
    ON CONFLICT (domain) DO UPDATE
    SET
        owner_id = excluded.owner_id,
        plan = excluded.plan,
        ttl_minutes = excluded.ttl_minutes,
        max_open = excluded.max_open;
END;
$$;

COMMENT ON FUNCTION mailroom.set_catchall_domain(text, text, text, integer, integer) IS
'Make a domain (or every subdomain of one: *.example.com) catch-all (or change it): unknown addresses on it get an inbox at RCPT, owned by (api, p_owner_id), on p_plan, at most p_max_open open at once. Errors: MR245 not a domain name or pattern (* is the sink), MR201 unknown plan, MR202 TTL not positive, MR210 bad owner.';

GRANT EXECUTE ON FUNCTION mailroom.set_catchall_domain(text, text, text, integer, integer) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.remove_catchall_domain(p_domain text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- its inboxes stay (they expire as usual); new unknown addresses are refused again; its fault
    -- (sql/24_faults.sql) goes with it
    DELETE FROM mailroom.inbox_faults AS f WHERE f.catchall_domain = lower(btrim(p_domain));
    DELETE FROM mailroom.catchall_domains AS d WHERE d.domain = lower(btrim(p_domain));
    RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION mailroom.remove_catchall_domain(text) IS
'Stop a domain being catch-all (its inboxes stay until they expire); false if it was not one.';

GRANT EXECUTE ON FUNCTION mailroom.remove_catchall_domain(text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.list_catchall_domains()
RETURNS TABLE (
    domain text,
    owner_id text,
    plan text,
    ttl_minutes integer,
    max_open integer,
    open_inboxes bigint,
    created_at timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT
        d.domain, d.owner_id, d.plan, d.ttl_minutes, d.max_open,
        (
            SELECT count(*) FROM mailroom.mailboxes AS m
            WHERE m.catchall_domain = d.domain AND m.is_active AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, mailroom.clock())
        ),
        d.created_at
    FROM mailroom.catchall_domains AS d
    ORDER BY d.domain;
END;
$$;

COMMENT ON FUNCTION mailroom.list_catchall_domains() IS
'The catch-all domains with their owner, plan, TTL, quota and open inboxes now.';

GRANT EXECUTE ON FUNCTION mailroom.list_catchall_domains() TO mailroom_admin;
