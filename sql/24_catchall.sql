-- Catch-all inbox domains (docs/http.md): the first RCPT to an unknown address on a catch-all
-- domain creates its inbox, under the domain's plan and owner (owner type api: an API key of that
-- owner reads it), within the domain's quota of open inboxes, in the same call as the RCPT check
-- (check_bounce_recipient in sql/26_bounces.sql, and deliver_ses_message in sql/29_ses.sql).
-- Off by default: no domain is catch-all until an admin sets one.
-- Errors: MR201 unknown plan, MR202 bad TTL, MR210 bad owner, MR245 bad domain or quota.

CREATE OR REPLACE FUNCTION mailroom_internal._check_recipient_or_claim(
    p_address text,
    p_size bigint DEFAULT null
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
BEGIN
    -- check_recipient's verdict; only an unknown address on a catch-all domain goes further, so
    -- every other RCPT costs one primary-key probe more than check_recipient alone, at most.
    SELECT c.verdict, c.address INTO verdict, address FROM mailroom.check_recipient(p_address, p_size) AS c;
    IF verdict <> 'unknown' OR NOT mailroom_internal._is_valid_address(address) THEN
        RETURN NEXT;
        RETURN;
    END IF;
    -- the domain row is locked: creations on one domain take turns, so its quota is exact
    SELECT d.* INTO v_domain
    FROM mailroom.catchall_domains AS d
    WHERE d.domain = split_part(address, '@', 2)
    FOR UPDATE;
    IF NOT FOUND THEN
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

COMMENT ON FUNCTION mailroom_internal._check_recipient_or_claim(text, bigint) IS
'Internal: check_recipient''s verdict, after creating the inbox of an unknown address on a catch-all domain (within its quota).';

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
    IF NOT coalesce(mailroom_internal._is_domain_name(v_domain), false) THEN
        RAISE EXCEPTION USING ERRCODE = 'MR245', MESSAGE = 'a catch-all domain must be a domain name';
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
'Make a domain catch-all (or change it): unknown addresses on it get an inbox at RCPT, owned by (api, p_owner_id), on p_plan, at most p_max_open open at once. Errors: MR245 not a domain name, MR201 unknown plan, MR202 TTL not positive, MR210 bad owner.';

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
