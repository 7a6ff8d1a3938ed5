-- Per recipient domain limits (docs/limits.md): which limit row governs a domain, how much room
-- a domain has now (taken under a per-domain lock by claim_messages), which SMTP replies mean
-- "this domain is throttling us" (finalize_messages backs the domain off), and the admin API.
-- Error codes: MR323 claim outside READ COMMITTED with limits on, MR370 bad pattern, MR371 bad
-- limit, MR372 no such limit, MR373 the default row cannot be removed.

CREATE OR REPLACE FUNCTION mailroom_internal._recipient_domain(p_to text[], p_cc text[], p_bcc text[])
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The domain a message counts against: its first recipient's (to, then cc, then bcc), in
    -- the stored form of an address (mailroom_internal._normalize_address), without a trailing dot;
    -- '' when there is no recipient. PL/pgSQL for the reason given at _classify_outcome
    -- (enqueue calls it per message).
    RETURN coalesce(
        rtrim(
            split_part(
                mailroom_internal._normalize_address((coalesce(p_to, '{}') || coalesce(p_cc, '{}') || coalesce(p_bcc, '{}'))[1]),
                '@', 2
            ),
            '.'
        ),
        ''
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._recipient_domain(text[], text[], text[]) IS
'Internal: the recipient domain of a message (first of to, cc, bcc; lower case, no trailing dot), the key of the domain limits.';

CREATE OR REPLACE FUNCTION mailroom_internal._normalize_domain(p_domain text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A recipient domain as an operator types it, in the form rcpt_domain stores: trimmed, lower
    -- case, without a trailing dot.
    RETURN rtrim(lower(btrim(p_domain)), '.');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._normalize_domain(text) IS
'Internal: a recipient domain in the stored form of outbound_messages.rcpt_domain (trimmed, lower case, no trailing dot).';

CREATE OR REPLACE FUNCTION mailroom_internal._domain_patterns(p_domain text)
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- The patterns that match a domain, most specific first: the domain itself, then
    -- '*.<parent>' for each parent from the nearest up, then '*'.
    -- 'a.b.example.com' -> {a.b.example.com, *.b.example.com, *.example.com, *.com, *}
    SELECT ARRAY[p_domain]
        || ARRAY(
            SELECT '*.' || array_to_string(l.labels[i.i:], '.')
            FROM (SELECT string_to_array(p_domain, '.') AS labels) AS l
            CROSS JOIN LATERAL generate_subscripts(l.labels, 1) AS i (i)
            WHERE i.i > 1
            ORDER BY i.i
        )
        || ARRAY['*'];
$$;

COMMENT ON FUNCTION mailroom_internal._domain_patterns(text) IS
'Internal: the limit patterns matching a domain, most specific first (the domain, *.parent ..., *).';

CREATE OR REPLACE FUNCTION mailroom_internal._domain_limit(p_domain text)
RETURNS TABLE (pattern text, max_in_flight integer, max_per_minute integer)
LANGUAGE sql
STABLE
-- at most one row: the planner must not think each domain multiplies into a thousand
ROWS 1
SET search_path = pg_catalog, pg_temp
AS $$
    -- The limit row that governs a domain: the most specific matching pattern. No row at all
    -- (the '*' row cannot be removed through the API) means no limit.
    SELECT l.pattern, l.max_in_flight, l.max_per_minute
    FROM mailroom.domain_limits AS l
    WHERE l.pattern = ANY(mailroom_internal._domain_patterns(p_domain))
    ORDER BY array_position(mailroom_internal._domain_patterns(p_domain), l.pattern)
    LIMIT 1;
$$;

COMMENT ON FUNCTION mailroom_internal._domain_limit(text) IS
'Internal: the domain_limits row governing a domain (exact, then the nearest *.parent, then *).';

CREATE OR REPLACE FUNCTION mailroom_internal._domain_room(
    p_domain text, p_now timestamptz, p_max_in_flight integer, p_max_per_minute integer
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_in_flight integer;
    v_window_count integer;
    v_backoff timestamptz;
    v_room integer := 2147483647;
BEGIN
    -- How many more messages of p_domain this claim may take. The per-domain lock makes the
    -- answer hold until the claim commits: a claimer that cannot take it at once gets 0 and
    -- skips the domain (never waits; FOR UPDATE SKIP LOCKED). The lock is taken first, so the counts below (each
    -- query of a VOLATILE function reads a fresh snapshot in READ COMMITTED) include every
    -- claim committed by an earlier holder, whatever the snapshot of the calling statement.
    -- The lock is one of the 1024 rows of mailroom.domain_locks (migration 0150), picked by a
    -- hash of the domain (an advisory key could be taken by any login, with no mailroom role, and
    -- hold the domain for as long as it liked). Two domains may share a row: a claimer holding
    -- it then skips the other one for this claim too (and the holder gets room for both).
    PERFORM 1 FROM mailroom.domain_locks AS k
    WHERE k.bucket = (pg_catalog.hashtextextended(p_domain, 0) & 1023)::integer
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    SELECT
        s.backoff_until,
        CASE WHEN s.window_start = date_trunc('minute', p_now) THEN s.window_count ELSE 0 END
    INTO v_backoff, v_window_count
    FROM mailroom.domain_state AS s
    WHERE s.domain = p_domain;
    IF v_backoff > p_now THEN
        RETURN 0;
    END IF;
    IF p_max_in_flight IS NOT NULL THEN
        SELECT count(*) INTO v_in_flight
        FROM mailroom.outbound_messages AS m
        WHERE m.status = 'processing' AND m.rcpt_domain = p_domain;
        v_room := least(v_room, p_max_in_flight - v_in_flight);
    END IF;
    IF p_max_per_minute IS NOT NULL THEN
        v_room := least(v_room, p_max_per_minute - coalesce(v_window_count, 0));
    END IF;
    RETURN greatest(v_room, 0);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._domain_room(text, timestamptz, integer, integer) IS
'Internal: room left for a capped domain now (0 if backed off or its lock is held elsewhere); takes the per-domain claim lock.';

CREATE OR REPLACE FUNCTION mailroom_internal._blocked_domains(p_now timestamptz)
RETURNS TABLE (domain text)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The domains that can get nothing claimed at p_now: backed off, at their per-minute cap, or
    -- at their in-flight cap (by the caller's snapshot). The claim skips their rows; the queue's
    -- statistics count their due messages as held back by limits, not as due. PL/pgSQL for the
    -- reason given at _classify_outcome (every claim with limits on calls it).
    RETURN QUERY
    SELECT s.domain
    FROM mailroom.domain_state AS s
    WHERE s.backoff_until > p_now
    UNION
    SELECT s.domain
    FROM mailroom.domain_state AS s
    CROSS JOIN LATERAL mailroom_internal._domain_limit(s.domain) AS l
    WHERE s.window_start = date_trunc('minute', p_now) AND s.window_count >= l.max_per_minute
    UNION
    SELECT p.domain
    FROM (
        SELECT x.rcpt_domain AS domain, count(*) AS n
        FROM mailroom.outbound_messages AS x
        WHERE x.status = 'processing'
        GROUP BY x.rcpt_domain
    ) AS p
    CROSS JOIN LATERAL mailroom_internal._domain_limit(p.domain) AS l
    WHERE p.n >= l.max_in_flight;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._blocked_domains(timestamptz) IS
'Internal: recipient domains that can get nothing claimed now (backed off, per-minute cap reached, in-flight cap reached).';

CREATE OR REPLACE FUNCTION mailroom_internal._is_domain_throttle(
    p_outcome text, p_smtp_code integer, p_enhanced_code text, p_error text
)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Whether an SMTP reply says the receiving domain is slowing us down, not that this
    -- message is wrong: 421 (service not available, too many connections), any 4.7.x
    -- (policy, rate limit, greylisting), 450/451 without an enhanced code or with 4.3.0/4.4.x
    -- (greylisting, local congestion), or a 4yz whose text says so ("too many connections",
    -- "rate limit", "throttl...", "greylist"). A 4.2.x (mailbox busy or full) is the recipient's.
    -- PL/pgSQL for the reason given at mailroom_internal._classify_outcome (finalize calls it per row).
    RETURN coalesce(
        p_outcome = 'reply'
        AND p_smtp_code BETWEEN 400 AND 499
        AND (
            p_smtp_code = 421
            OR p_enhanced_code ~ '^4[.]7[.][0-9]{1,3}$'
            OR (p_smtp_code IN (450, 451) AND (p_enhanced_code IS NULL OR p_enhanced_code ~ '^4[.](3[.]0|4[.][0-9]{1,3})$'))
            OR p_error ~* '(too many (connections|sessions|messages)|rate.?limit|throttl|greylist)'
        ),
        FALSE
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._is_domain_throttle(text, integer, text, text) IS
'Internal: whether a delivery outcome is the domain throttling us (421, 4.7.x, greylisting 450/451, "too many connections").';

CREATE OR REPLACE FUNCTION mailroom_internal._domain_backoff_delay(p_level integer, p_base interval, p_max interval)
RETURNS interval
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- base * 2 ^ (level - 1), at most max. IMMUTABLE, the settings being arguments (Citus:
    -- _note_domain_outcomes' ON CONFLICT DO UPDATE calls it).
    SELECT least(p_max, p_base * power(2, least(greatest(p_level, 1), 30) - 1));
$$;

COMMENT ON FUNCTION mailroom_internal._domain_backoff_delay(integer, interval, interval) IS
'Internal: a domain''s backoff at its p_level-th throttling episode: least(p_max, p_base * 2 ^ (p_level - 1)).';

CREATE OR REPLACE FUNCTION mailroom_internal._domain_backoff_delay(p_level integer)
RETURNS interval
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- outbound.domain_backoff_base * 2 ^ (level - 1), at most outbound.domain_backoff_max
    SELECT mailroom_internal._domain_backoff_delay(
        p_level,
        mailroom.setting('outbound.domain_backoff_base')::interval,
        mailroom.setting('outbound.domain_backoff_max')::interval
    );
$$;

COMMENT ON FUNCTION mailroom_internal._domain_backoff_delay(integer) IS
'Internal: backoff of a domain at its n-th consecutive throttling episode (base doubling, capped by outbound.domain_backoff_max).';

CREATE OR REPLACE FUNCTION mailroom_internal._note_domain_outcomes(
    p_now timestamptz, p_throttled text[], p_succeeded text[]
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer := 0;
    v_base interval;
    v_max interval;
    -- an episode that ended before this started long ago: the next one starts over at level 1
    v_long_ago timestamptz;
    v_first timestamptz;
    v_domain text;
    v_throttled boolean;
BEGIN
    -- finalize_messages' part: a domain that throttled is backed off (a new episode doubles the
    -- delay; a throttle reported while the backoff is running, from messages claimed before it,
    -- changes nothing), a domain with a success and no throttle in the batch is cleared. Rows
    -- are written in domain order, the claim's order too, so the two never deadlock.
    IF coalesce(cardinality(p_throttled), 0) = 0 AND coalesce(cardinality(p_succeeded), 0) = 0 THEN
        RETURN 0;
    END IF;
    v_base := mailroom.setting('outbound.domain_backoff_base')::interval;
    v_max := mailroom.setting('outbound.domain_backoff_max')::interval;
    v_long_ago := mailroom_internal._later(p_now, -v_max);
    v_first := mailroom_internal._later(p_now, mailroom_internal._domain_backoff_delay(1, v_base, v_max));
    -- One row per statement (a batch names few domains): on Citus, an INSERT … SELECT into
    -- domain_state with a subquery on it, or with variables in its DO UPDATE, cannot be planned,
    -- while this form runs on one node as on Citus (docs/scale.md). Everything in DO UPDATE is
    -- IMMUTABLE or a variable, as Citus requires.
    FOR v_domain, v_throttled IN
        SELECT t.domain, true
        FROM (SELECT DISTINCT u.domain FROM unnest(p_throttled) AS u (domain)) AS t
        UNION ALL
        -- the domains that accepted and have a backoff to clear (no write per success otherwise)
        SELECT t.domain, false
        FROM (SELECT DISTINCT u.domain FROM unnest(p_succeeded) AS u (domain)) AS t
        WHERE
            t.domain <> ALL (coalesce(p_throttled, '{}'))
            AND EXISTS (
                SELECT 1 FROM mailroom.domain_state AS x
                WHERE x.domain = t.domain AND (x.backoff_level > 0 OR x.backoff_until IS NOT NULL)
            )
        ORDER BY 1
    LOOP
        INSERT INTO mailroom.domain_state AS s (domain, backoff_until, backoff_level, updated_at)
        VALUES (
            v_domain,
            CASE WHEN v_throttled THEN v_first END,
            CASE WHEN v_throttled THEN 1 ELSE 0 END,
            p_now
        )
        ON CONFLICT (domain) DO UPDATE
        SET
            backoff_level = CASE
                WHEN excluded.backoff_level = 0 THEN 0
                WHEN s.backoff_until > excluded.updated_at THEN s.backoff_level
                -- the last episode ended long ago: start over
                WHEN s.backoff_until < v_long_ago THEN 1
                ELSE s.backoff_level + 1
            END,
            backoff_until = CASE
                WHEN excluded.backoff_level = 0 THEN NULL
                WHEN s.backoff_until > excluded.updated_at THEN s.backoff_until
                WHEN s.backoff_until < v_long_ago THEN v_first
                ELSE mailroom_internal._later(
                    excluded.updated_at, mailroom_internal._domain_backoff_delay(s.backoff_level + 1, v_base, v_max)
                )
            END,
            updated_at = excluded.updated_at;
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._note_domain_outcomes(timestamptz, text[], text[]) IS
'Internal: finalize''s domain backoff: start or escalate it for domains that throttled, clear it for domains that accepted.';

CREATE OR REPLACE FUNCTION mailroom_internal._normalize_domain_pattern(p_pattern text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_pattern text := rtrim(lower(btrim(p_pattern)), '.');
BEGIN
    IF v_pattern IS NULL OR NOT (
        v_pattern = '*'
        -- a domain, or *. and a domain (its subdomains)
        OR mailroom_internal._is_domain_name(v_pattern)
        OR (left(v_pattern, 2) = '*.' AND mailroom_internal._is_domain_name(substr(v_pattern, 3)))
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR370',
            MESSAGE = format(
                'domain pattern must be *, a domain (example.com) or *.domain (its subdomains), got %s',
                coalesce(quote_literal(left(p_pattern, 60)), 'NULL')
            );
    END IF;
    RETURN v_pattern;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._normalize_domain_pattern(text) IS
'Internal: a limit pattern in stored form (lower case, no trailing dot), or MR370.';

CREATE OR REPLACE FUNCTION mailroom.set_domain_limit(
    p_pattern text, p_max_in_flight integer, p_max_per_minute integer
)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_pattern text := mailroom_internal._normalize_domain_pattern(p_pattern);
BEGIN
    IF p_max_in_flight < 1 OR p_max_per_minute < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR371',
            MESSAGE = 'max in flight and max per minute must be at least 1 (NULL: no limit)';
    END IF;
    INSERT INTO mailroom.domain_limits AS l (pattern, max_in_flight, max_per_minute, updated_at)
    VALUES (v_pattern, p_max_in_flight, p_max_per_minute, mailroom.clock())
    ON CONFLICT (pattern) DO UPDATE
    SET
        max_in_flight = excluded.max_in_flight,
        max_per_minute = excluded.max_per_minute,
        updated_at = excluded.updated_at;
    RETURN v_pattern;
END;
$$;

COMMENT ON FUNCTION mailroom.set_domain_limit(text, integer, integer) IS
'Create or change the limit of a domain pattern (*, example.com, *.example.com): max in flight, max claimed per minute (NULL: none); returns the stored pattern. Errors: MR370 bad pattern, MR371 limit below 1.';

GRANT EXECUTE ON FUNCTION mailroom.set_domain_limit(text, integer, integer) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.delete_domain_limit(p_pattern text)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_pattern text := mailroom_internal._normalize_domain_pattern(p_pattern);
BEGIN
    IF v_pattern = '*' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR373',
            MESSAGE = 'the default limit * cannot be removed',
            HINT = 'set it to no limit instead: set_domain_limit(''*'', NULL, NULL)';
    END IF;
    DELETE FROM mailroom.domain_limits AS l WHERE l.pattern = v_pattern;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR372',
            MESSAGE = format('no domain limit for pattern %s', quote_literal(v_pattern));
    END IF;
    RETURN v_pattern;
END;
$$;

COMMENT ON FUNCTION mailroom.delete_domain_limit(text) IS
'Remove the limit of a domain pattern (its domains fall back to the next matching pattern); MR372 if none, MR373 for *.';

GRANT EXECUTE ON FUNCTION mailroom.delete_domain_limit(text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.list_domain_limits()
RETURNS TABLE (pattern text, max_in_flight integer, max_per_minute integer, updated_at timestamptz)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.pattern, l.max_in_flight, l.max_per_minute, l.updated_at
    FROM mailroom.domain_limits AS l
    ORDER BY l.pattern = '*', l.pattern;
$$;

COMMENT ON FUNCTION mailroom.list_domain_limits() IS
'Every domain limit row (pattern, max in flight, max per minute; NULL: no limit), the default * last.';

GRANT EXECUTE ON FUNCTION mailroom.list_domain_limits() TO mailroom_monitor, mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.domain_status(p_limit integer DEFAULT 100)
RETURNS TABLE (
    domain text,
    pattern text,
    in_flight bigint,
    max_in_flight integer,
    claimed_this_minute integer,
    max_per_minute integer,
    backoff_until timestamptz,
    backoff_level integer
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR371',
            MESSAGE = format('list limit must be between 1 and 10000, got %s', coalesce(p_limit::text, 'NULL'));
    END IF;
    -- the domains with messages in flight, a count this minute or a backoff, busiest first
    RETURN QUERY
    WITH f AS (
        SELECT m.rcpt_domain AS domain, count(*) AS n
        FROM mailroom.outbound_messages AS m
        WHERE m.status = 'processing'
        GROUP BY m.rcpt_domain
    ),

    s AS (
        SELECT
            x.domain,
            CASE WHEN x.window_start = date_trunc('minute', v_now) THEN x.window_count ELSE 0 END AS window_count,
            x.backoff_until,
            x.backoff_level
        FROM mailroom.domain_state AS x
        WHERE x.backoff_level > 0 OR x.backoff_until > v_now OR x.window_start = date_trunc('minute', v_now)
    )

    SELECT
        coalesce(f.domain, s.domain),
        l.pattern,
        coalesce(f.n, 0),
        l.max_in_flight,
        coalesce(s.window_count, 0),
        l.max_per_minute,
        s.backoff_until,
        coalesce(s.backoff_level, 0)
    FROM f
    FULL JOIN s ON f.domain = s.domain
    LEFT JOIN LATERAL mailroom_internal._domain_limit(coalesce(f.domain, s.domain)) AS l ON TRUE
    ORDER BY coalesce(f.n, 0) DESC, s.backoff_until DESC NULLS LAST, 1
    LIMIT p_limit;
END;
$$;

COMMENT ON FUNCTION mailroom.domain_status(integer) IS
'Domains with messages in flight, claims this minute or a backoff: counts next to the governing limit. Errors: MR371 bad limit.';

GRANT EXECUTE ON FUNCTION mailroom.domain_status(integer) TO mailroom_monitor, mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.clear_domain_backoff(p_domain text)
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- true when the domain had a backoff (now lifted)
    WITH cleared AS (
        UPDATE mailroom.domain_state AS s
        SET backoff_until = NULL, backoff_level = 0, updated_at = mailroom.clock()
        WHERE s.domain = mailroom_internal._normalize_domain(p_domain) AND (s.backoff_until IS NOT NULL OR s.backoff_level > 0)
        RETURNING 1
    )

    SELECT count(*) > 0 FROM cleared;
$$;

COMMENT ON FUNCTION mailroom.clear_domain_backoff(text) IS
'Lift the backoff of a recipient domain now (claim takes its messages again); true if it had one.';

GRANT EXECUTE ON FUNCTION mailroom.clear_domain_backoff(text) TO mailroom_admin;
