-- The suppression list: addresses mailroom does not send to (docs/bounces.md). Addresses are
-- PII: adding, removing and listing are for mailroom_admin; the application may only ask
-- whether one address is suppressed. Error messages never contain an address.

CREATE OR REPLACE FUNCTION mailroom_internal._suppression_id(p_address text)
RETURNS bigint
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- The id of the suppression that applies to p_address now (mailroom.clock()), else NULL:
    -- an entry whose expires_at has passed no longer applies.
    SELECT s.id
    FROM mailroom.suppressions AS s
    WHERE
        s.address = ANY(mailroom_internal._suppression_keys(p_address))
        AND (s.expires_at IS NULL OR s.expires_at > mailroom.clock());
$$;

COMMENT ON FUNCTION mailroom_internal._suppression_id(text) IS
'Internal: id of the suppression in force now for an address (normalized), else NULL.';

CREATE OR REPLACE FUNCTION mailroom_internal._suppressed_flags(p_addresses text[])
RETURNS boolean[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_norm text[];
    v_erased text[];
    v_found text[];
BEGIN
    -- Whether each address of a list is suppressed now (same order; NULL: false), the whole list
    -- in one pass (issue 37): the suppression keys of every address (_suppression_keys: the
    -- address normalized and its erased form, whose HMACs under the redaction pepper are one
    -- _hmac_many call) and ONE index probe of mailroom.suppressions for all of them. Per address,
    -- _suppression_id cost an SQL-function start and planning, a PL/pgSQL call for its keys and
    -- one for its HMAC: ~1 ms an address, 5.7 ms the 5 recipients of a message (bench/profile_outbound_work.py).
    IF coalesce(cardinality(p_addresses), 0) = 0 THEN
        RETURN '{}';
    END IF;
    v_norm := ARRAY(
        SELECT mailroom_internal._normalize_address(a.address)
        FROM unnest(p_addresses) WITH ORDINALITY AS a (address, n)
        ORDER BY a.n
    );
    -- _erased_form's value for each: erased:<hex of HMAC-SHA256(normalized) under the pepper>
    v_erased := ARRAY(
        SELECT 'erased:' || encode(h.mac, 'hex')
        FROM mailroom.redaction_pepper AS p
        CROSS JOIN LATERAL unnest(mailroom_internal._hmac_many(
            ARRAY(SELECT convert_to(x.v, 'UTF8') FROM unnest(v_norm) WITH ORDINALITY AS x (v, n) ORDER BY x.n),
            p.pepper, 'sha256'
        )) WITH ORDINALITY AS h (mac, n)
        WHERE p.singleton
        ORDER BY h.n
    );
    v_found := ARRAY(
        SELECT s.address
        FROM mailroom.suppressions AS s
        WHERE
            s.address = ANY(v_norm || v_erased)
            AND (s.expires_at IS NULL OR s.expires_at > mailroom.clock())
    );
    RETURN ARRAY(
        SELECT coalesce(v_norm[i] = ANY(v_found) OR v_erased[i] = ANY(v_found), false)
        FROM generate_series(1, cardinality(p_addresses)) AS i
        ORDER BY i
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._suppressed_flags(text[]) IS
'Internal: whether each address of a list (same order) is suppressed now; one HMAC batch and one index probe for the list.';

CREATE OR REPLACE FUNCTION mailroom_internal._suppressed(p_address text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_norm text := mailroom_internal._normalize_address(p_address);
    v_erased text;
BEGIN
    -- _suppression_id's test for one address (is_suppressed), in PL/pgSQL whose plans the session
    -- caches (an SQL function with SET is planned at every call): its two keys, the normalized
    -- address and its erased form (_erased_form: one HMAC under the redaction pepper), one probe.
    -- 0.2-0.4 ms against 1.5-1.8 ms a call (issue 37, bench/profile_outbound_work.py)
    SELECT 'erased:' || encode(mailroom_internal._hmac(convert_to(v_norm, 'UTF8'), p.pepper, 'sha256'), 'hex')
    INTO v_erased
    FROM mailroom.redaction_pepper AS p
    WHERE p.singleton;
    RETURN EXISTS (
        SELECT 1
        FROM mailroom.suppressions AS s
        WHERE
            s.address IN (v_norm, v_erased)
            AND (s.expires_at IS NULL OR s.expires_at > mailroom.clock())
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._suppressed(text) IS
'Internal: whether a suppression is in force now for an address (the enqueue paths use it).';

CREATE OR REPLACE FUNCTION mailroom_internal._add_suppression(
    p_address text,
    p_reason text,
    p_expires_at timestamptz,
    p_source_message bigint
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_id bigint;
BEGIN
    -- One entry per address. An expired entry is replaced; an entry in force is updated to the
    -- new reason, source and expiry (suppress is how an operator changes them), except that a
    -- hard bounce never shortens or replaces an entry already in force (finalize_messages and,
    -- later, bounce parsing call this for every 5xx).
    INSERT INTO mailroom.suppressions AS s (address, reason, source_message, created_at, expires_at)
    VALUES (mailroom_internal._normalize_address(p_address), p_reason, p_source_message, v_now, p_expires_at)
    ON CONFLICT (address) DO UPDATE
    SET
        reason = excluded.reason,
        source_message = excluded.source_message,
        created_at = excluded.created_at,
        expires_at = excluded.expires_at
    WHERE
        excluded.reason <> 'hard_bounce'
        OR (s.expires_at IS NOT NULL AND s.expires_at <= v_now)
    RETURNING s.id INTO v_id;
    IF v_id IS NULL THEN
        SELECT s.id INTO v_id
        FROM mailroom.suppressions AS s
        WHERE s.address = mailroom_internal._normalize_address(p_address);
    END IF;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._add_suppression(text, text, timestamptz, bigint) IS
'Internal: insert or refresh a suppression (a hard bounce never overrides one in force); returns its id.';

CREATE OR REPLACE FUNCTION mailroom.suppress(
    p_address text,
    p_reason text,
    p_expires_at timestamptz DEFAULT null,
    p_source_message bigint DEFAULT null
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT coalesce(mailroom_internal._is_valid_address(mailroom_internal._normalize_address(p_address)), false) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR350',
            MESSAGE = 'the address to suppress is not a valid email address';
    END IF;
    IF p_reason IS NULL OR p_reason NOT IN ('hard_bounce', 'complaint', 'manual') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR351',
            MESSAGE = format(
                'reason must be hard_bounce, complaint or manual, got %s',
                coalesce(quote_literal(left(p_reason, 40)), 'NULL')
            );
    END IF;
    IF p_expires_at IS NOT NULL AND (NOT isfinite(p_expires_at) OR p_expires_at <= mailroom.clock()) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR352',
            MESSAGE = 'expires_at must be a finite time in the future (NULL: until removed)';
    END IF;
    RETURN mailroom_internal._add_suppression(p_address, p_reason, p_expires_at, p_source_message);
END;
$$;

COMMENT ON FUNCTION mailroom.suppress(text, text, timestamptz, bigint) IS
'Put an address on the suppression list (hard_bounce, complaint, manual), until p_expires_at or removed; returns the entry id. Errors: MR350 bad address, MR351 bad reason, MR352 bad expiry.';

GRANT EXECUTE ON FUNCTION mailroom.suppress(text, text, timestamptz, bigint) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.unsuppress(p_address text)
RETURNS boolean
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- true when an entry was removed (expired or not), false when there was none
    WITH gone AS (
        DELETE FROM mailroom.suppressions AS s
        WHERE s.address = ANY(mailroom_internal._suppression_keys(p_address))
        RETURNING s.id
    )

    SELECT EXISTS (SELECT 1 FROM gone);
$$;

COMMENT ON FUNCTION mailroom.unsuppress(text) IS
'Remove an address from the suppression list; true if it was there.';

GRANT EXECUTE ON FUNCTION mailroom.unsuppress(text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.is_suppressed(p_address text)
RETURNS boolean
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailroom_internal._suppressed(p_address);
$$;

COMMENT ON FUNCTION mailroom.is_suppressed(text) IS
'Whether enqueue would treat this address as suppressed now (an expired entry does not count).';

GRANT EXECUTE ON FUNCTION mailroom.is_suppressed(text) TO mailroom_app, mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.list_suppressions(p_limit integer DEFAULT 100)
RETURNS TABLE (
    id bigint,
    address text,
    reason text,
    source_message bigint,
    created_at timestamptz,
    expires_at timestamptz,
    active boolean
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR353',
            MESSAGE = format('limit must be 1..100000, got %s', coalesce(p_limit::text, 'NULL'));
    END IF;
    -- newest first; expired entries are listed (active = false) until removed
    RETURN QUERY
    SELECT
        s.id, s.address, s.reason, s.source_message, s.created_at, s.expires_at,
        (s.expires_at IS NULL OR s.expires_at > mailroom.clock())
    FROM mailroom.suppressions AS s
    ORDER BY s.created_at DESC, s.id DESC
    LIMIT p_limit;
END;
$$;

COMMENT ON FUNCTION mailroom.list_suppressions(integer) IS
'The suppression list, newest first, with whether each entry is in force (addresses: admin only). Errors: MR353 bad limit.';

GRANT EXECUTE ON FUNCTION mailroom.list_suppressions(integer) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom_internal._suppressed_positions(p_kind text, p_addresses text[])
RETURNS text[]
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the positions ('to[2]') of the suppressed addresses in a recipient list, in order
    SELECT coalesce(array_agg(format('%s[%s]', p_kind, a.n) ORDER BY a.n), '{}')
    FROM unnest(mailroom_internal._suppressed_flags(p_addresses)) WITH ORDINALITY AS a (hit, n)
    WHERE a.hit;
$$;

COMMENT ON FUNCTION mailroom_internal._suppressed_positions(text, text[]) IS
'Internal: positions (kind[n], never the value) of the suppressed addresses of a recipient list.';

CREATE OR REPLACE FUNCTION mailroom_internal._without_suppressed(p_addresses text[])
RETURNS text[]
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(array_agg(a.address ORDER BY a.n), '{}')
    FROM unnest(p_addresses, mailroom_internal._suppressed_flags(p_addresses)) WITH ORDINALITY AS a (address, hit, n)
    WHERE NOT a.hit;
$$;

COMMENT ON FUNCTION mailroom_internal._without_suppressed(text[]) IS
'Internal: a recipient list without its suppressed addresses, in order.';

CREATE OR REPLACE FUNCTION mailroom_internal._suppressed_recipients(p_to text[], p_cc text[], p_bcc text[])
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_to integer := coalesce(cardinality(p_to), 0);
    v_cc integer := coalesce(cardinality(p_cc), 0);
    v_flags boolean[] := mailroom_internal._suppressed_flags(
        coalesce(p_to, '{}') || coalesce(p_cc, '{}') || coalesce(p_bcc, '{}')
    );
    v_out text[] := '{}';
BEGIN
    -- positions (to[1], bcc[2]) of a message's recipients on the suppression list now: one
    -- _suppressed_flags call for all of them (enqueue, retry)
    FOR i IN 1..cardinality(v_flags) LOOP
        IF v_flags[i] THEN
            v_out := v_out || CASE
                WHEN i <= v_to THEN format('to[%s]', i)
                WHEN i <= v_to + v_cc THEN format('cc[%s]', i - v_to)
                ELSE format('bcc[%s]', i - v_to - v_cc)
            END;
        END IF;
    END LOOP;
    RETURN v_out;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._suppressed_recipients(text[], text[], text[]) IS
'Internal: positions (never the addresses) of a message''s recipients that are suppressed now.';
