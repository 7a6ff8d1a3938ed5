-- claim_messages: one statement turns up to p_limit due rows into processing under a lease
-- (FOR UPDATE SKIP LOCKED over the partial index outbound_messages_due_idx, higher priority first,
-- then due order) and returns them
-- with their relay settings; the SMTP password is decrypted only when the caller passes the key.

-- Domain limits on (docs/limits.md, sql/39_outbound_domain_limits.sql): the due CTE becomes
-- four. Rows of uncapped domains are taken in due order as before; a capped domain gets at
-- most the room _domain_room grants it, under a per-domain lock that a concurrent claimer
-- skips instead of waiting for. Claims of per-minute capped domains are counted after.
CREATE OR REPLACE FUNCTION mailroom._claim_limited_due()
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN $q$
blocked AS MATERIALIZED (
    -- domains that can get nothing now by this statement's snapshot (backed off, at the
    -- per-minute cap, or at the in-flight cap): a hint so the scan skips their rows. The
    -- decision that holds against concurrent claimers is _domain_room's, under the lock.
    SELECT b.domain FROM mailroom._blocked_domains($1) AS b
),

head AS MATERIALIZED (
    -- the due rows in claim order (the same index scan as without limits), skipping blocked
    -- domains; twice the limit, so a capped domain's surplus leaves room for the others
    SELECT
        m.id, m.created_at, m.rcpt_domain, m.priority, coalesce(m.next_retry_at, '-infinity'::timestamptz) AS due_at
    FROM mailroom.outbound_messages AS m
    WHERE
        m.status = 'queued'
        AND (m.next_retry_at IS NULL OR m.next_retry_at <= $1)
        AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= $1
        AND m.rcpt_domain <> ALL (ARRAY(SELECT b.domain FROM blocked AS b))
    ORDER BY m.priority DESC, coalesce(m.next_retry_at, '-infinity'::timestamptz), m.id
    LIMIT 2 * $2 + 8
    FOR UPDATE SKIP LOCKED
),

room AS MATERIALIZED (
    -- per domain of the head: no cap -> everything; a cap -> what _domain_room grants (it takes
    -- the domain's lock, or answers 0 when another claimer holds it)
    SELECT
        d.domain,
        l.max_per_minute,
        CASE
            WHEN l.max_in_flight IS NULL AND l.max_per_minute IS NULL THEN $2
            ELSE mailroom._domain_room(d.domain, $1, l.max_in_flight, l.max_per_minute)
        END AS room
    FROM (SELECT DISTINCT h.rcpt_domain AS domain FROM head AS h) AS d
    LEFT JOIN LATERAL mailroom._domain_limit(d.domain) AS l ON TRUE
),

due AS (
    SELECT r.id, r.created_at
    FROM (
        SELECT
            h.id,
            h.created_at,
            h.priority,
            h.due_at,
            o.room,
            row_number() OVER (PARTITION BY h.rcpt_domain ORDER BY h.priority DESC, h.due_at, h.id) AS n
        FROM head AS h
        INNER JOIN room AS o ON h.rcpt_domain = o.domain
    ) AS r
    WHERE r.n <= r.room
    ORDER BY r.priority DESC, r.due_at, r.id
    LIMIT $2
),

$q$;
END;
$fn$;

CREATE OR REPLACE FUNCTION mailroom._claim_limited_counted()
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN $q$
counted AS (
    -- claims of per-minute capped domains, counted in the current minute (domain order, the
    -- order finalize writes domain_state in too)
    INSERT INTO mailroom.domain_state AS s (domain, window_start, window_count, updated_at)
    SELECT c.rcpt_domain, date_trunc('minute', $1), count(*), $1
    FROM claimed AS c
    INNER JOIN room AS o ON c.rcpt_domain = o.domain
    WHERE o.max_per_minute IS NOT NULL
    GROUP BY c.rcpt_domain
    ORDER BY c.rcpt_domain
    ON CONFLICT (domain) DO UPDATE
    SET
        window_count = CASE
            WHEN s.window_start = excluded.window_start THEN s.window_count + excluded.window_count
            ELSE excluded.window_count
        END,
        window_start = excluded.window_start,
        updated_at = excluded.updated_at
),

$q$;
END;
$fn$;

COMMENT ON FUNCTION mailroom._claim_limited_due() IS
'Internal: the due CTEs of the claim statement when domain limits are on (caps, room under a per-domain lock, backoff).';

COMMENT ON FUNCTION mailroom._claim_limited_counted() IS
'Internal: the CTE of the claim statement that counts claims of per-minute capped domains.';

CREATE OR REPLACE FUNCTION mailroom._claim_statement(p_limited boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
-- $1 now, $2 limit, $3 worker, $4 lease, $5 key. Run with EXECUTE, so every call is
-- planned with the actual LIMIT and clock (a cached generic plan costs LIMIT $2 blind and
-- can flip to a seq scan + sort on a big queue). _explain_claim shows the same text's plan.
-- p_limited: the domain limits are on (docs/limits.md): the due CTE below is replaced by
-- _claim_limited_due() and the per-minute counts are written after the claim.
-- PL/pgSQL, not SQL: claim_messages calls it once per claim, and a SQL function with SET
-- search_path is parsed and planned on every call (with the limited texts folded in).
DECLARE
    v_q text := $q$
WITH /*due*/
due AS (
    SELECT m.id, m.created_at
    FROM mailroom.outbound_messages AS m
    WHERE
        m.status = 'queued'
        -- due: never tried or its retry time has come; the coalesce twin says the same on
        -- the index expression of outbound_messages_due_idx and bounds the index scan
        AND (m.next_retry_at IS NULL OR m.next_retry_at <= $1)
        AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= $1
    -- higher priority first, then due order: the order of outbound_messages_due_idx
    ORDER BY m.priority DESC, coalesce(m.next_retry_at, '-infinity'::timestamptz), m.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
/*end due*/
claimed AS (
    UPDATE mailroom.outbound_messages AS m
    SET
        status = 'processing',
        claimed_by = $3,
        claim_token = nextval('mailroom.outbound_claim_token_seq'),
        claimed_at = $1,
        lease_expires_at = $1 + $4,
        updated_at = $1
    -- a semi-join on (id, created_at): the primary key of the partitioned table, so each row is
    -- one probe of one partition (a join on id alone was planned as a hash join over all of them)
    WHERE (m.id, m.created_at) IN (SELECT due.id, due.created_at FROM due)
    RETURNING m.*
),
/*counted*/
relays AS MATERIALIZED (
    -- one decryption per sender, not per message
    SELECT
        s.id,
        s.name,
        s.from_address,
        s.smtp_host,
        s.smtp_port,
        s.smtp_security,
        s.smtp_username,
        mailroom._smtp_password(s.smtp_password_encrypted, $5, s.name) AS smtp_password,
        s.smtp_password_encrypted IS NOT NULL AS smtp_password_set
    FROM mailroom.senders AS s
    WHERE s.id IN (SELECT c.sender_id FROM claimed AS c)
)

SELECT
    c.id,
    c.claim_token,
    c.attempts,
    c.message_id,
    r.name,
    r.from_address,
    c.to_addrs,
    c.cc_addrs,
    c.bcc_addrs,
    c.subject,
    c.text_body,
    c.html_body,
    c.headers,
    c.created_at,
    c.possibly_sent,
    r.smtp_host,
    r.smtp_port,
    r.smtp_security,
    r.smtp_username,
    r.smtp_password,
    r.smtp_password_set,
    -- the VERP envelope sender (sql/36_outbound_bounces.sql), NULL without a bounce domain
    mailroom._return_path(c.id, c.sender_id) AS return_path
FROM claimed AS c
INNER JOIN relays AS r ON c.sender_id = r.id
ORDER BY c.id
$q$;
BEGIN
    IF NOT p_limited THEN
        RETURN v_q;
    END IF;
    RETURN replace(
        overlay(
            v_q PLACING mailroom._claim_limited_due()
            FROM strpos(v_q, '/*due*/')
            FOR strpos(v_q, '/*end due*/') + length('/*end due*/') - strpos(v_q, '/*due*/')
        ),
        '/*counted*/', mailroom._claim_limited_counted()
    );
END;
$fn$;

CREATE OR REPLACE FUNCTION mailroom.claim_messages(
    p_limit integer,
    p_worker text,
    p_key bytea DEFAULT null,
    p_lease interval DEFAULT null
)
RETURNS TABLE (
    id bigint,
    claim_token bigint,
    attempts integer,
    message_id text,
    sender_name text,
    from_address text,
    to_addrs text[],
    cc_addrs text[],
    bcc_addrs text[],
    subject text,
    text_body text,
    html_body text,
    headers jsonb,
    created_at timestamptz,
    possibly_sent boolean,
    smtp_host text,
    smtp_port integer,
    smtp_security text,
    smtp_username text,
    smtp_password text,
    smtp_password_set boolean,
    return_path text
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- outbound_messages is partitioned (issue 14): the claimed rows are found by a nested loop of
-- primary-key probes, each pruned at run time to one partition; a hash or merge join would
-- read every partition (the planner does not cost that pruning, so it is told).
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_lease interval;
    v_limited boolean;
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR320',
            MESSAGE = format('claim limit must be between 1 and 10000, got %s', coalesce(p_limit::text, 'NULL'));
    END IF;
    IF p_worker IS NULL OR length(p_worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR321',
            MESSAGE = 'worker name must be 1-200 characters';
    END IF;
    v_lease := coalesce(p_lease, mailroom.setting('outbound.lease')::interval);
    IF v_lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR322',
            MESSAGE = format('lease must be positive, got %s', v_lease);
    END IF;
    PERFORM mailroom._check_outbound_key(p_key);

    -- The domain limits (docs/limits.md) cost nothing while no limit is set and no domain is
    -- backed off: then the claim is the plain statement.
    SELECT EXISTS (
        SELECT 1 FROM mailroom.domain_limits AS l
        WHERE l.max_in_flight IS NOT NULL OR l.max_per_minute IS NOT NULL
    ) OR EXISTS (
        SELECT 1 FROM mailroom.domain_state AS s
        WHERE s.backoff_until > v_now
    ) INTO v_limited;
    IF v_limited AND current_setting('transaction_isolation') <> 'read committed' THEN
        -- _domain_room counts under its lock with a fresh snapshot, which only READ COMMITTED has
        RAISE EXCEPTION USING
            ERRCODE = 'MR323',
            MESSAGE = 'claim_messages must run in READ COMMITTED while domain limits are set';
    END IF;

    IF NOT v_limited AND p_limit <= 100 THEN
        -- the plain statement with a plan cached for the session (see _claim_cached below):
        -- planning is most of a small claim's cost
        RETURN QUERY SELECT * FROM mailroom._claim_cached(v_now, p_limit, p_worker, v_lease, p_key);
        RETURN;
    END IF;
    RETURN QUERY EXECUTE mailroom._claim_statement(v_limited)
    USING v_now, p_limit, p_worker, v_lease, p_key;
END;
$$;

-- _claim_cached: the same statement text as static SQL, so PL/pgSQL keeps one generic plan per
-- session instead of planning each claim. Planning grows with the number of outbound partitions
-- (1.7 ms at 9 against 0.6 ms of execution for claim_messages(1); the generic plan prunes at run
-- time: docs/benchmarks.md, "Since time partitioning"). A generic plan does not know LIMIT or the clock; the planner
-- settings leave it one shape, the one EXECUTE picks at any queue size (pgTAP 33 checks it):
-- the ordered scan of outbound_messages_due_idx that stops after LIMIT rows, primary-key
-- lookups for the update. jit = off for the reason given at finalize_messages. Generated from
-- _claim_statement() and claim_messages' result type on every migrate, so it cannot drift from
-- them (dropped first: a changed result type cannot be replaced).
DROP FUNCTION IF EXISTS mailroom._claim_cached(timestamptz, integer, text, interval, bytea);

DO $do$
BEGIN
    EXECUTE format(
        $f$
CREATE FUNCTION mailroom._claim_cached(
    p_now timestamptz, p_limit integer, p_worker text, p_lease interval, p_key bytea
)
RETURNS %s
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET jit = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET search_path = pg_catalog, pg_temp
AS %L
$f$,
        pg_catalog.pg_get_function_result('mailroom.claim_messages(integer,text,bytea,interval)'::regprocedure),
        E'#variable_conflict use_column\nBEGIN\n    RETURN QUERY '
        || mailroom._claim_statement(false)
        || E';\nEND;\n'
    );
END;
$do$;

COMMENT ON FUNCTION mailroom._claim_cached(timestamptz, integer, text, interval, bytea) IS
'Internal: the plain claim statement with a session-cached generic plan (generated from _claim_statement); claim_messages uses it up to LIMIT 100.';

COMMENT ON FUNCTION mailroom.claim_messages(integer, text, bytea, interval) IS
'Claim up to p_limit due queued messages (SKIP LOCKED) under a lease; returns them with relay settings.';

GRANT EXECUTE ON FUNCTION mailroom.claim_messages(integer, text, bytea, interval) TO mailroom_sender;

CREATE OR REPLACE FUNCTION mailroom._explain_claim(p_limit integer DEFAULT 100, p_limited boolean DEFAULT false)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- planned as claim_messages plans it
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    -- EXPLAIN without ANALYZE: plans the exact claim statement, changes nothing.
    RETURN QUERY EXECUTE 'EXPLAIN ' || mailroom._claim_statement(p_limited)
    USING mailroom.clock(), p_limit, 'explain', interval '5 minutes', NULL::bytea;
END;
$$;

COMMENT ON FUNCTION mailroom._claim_statement(boolean) IS
'Internal: text of the claim statement (with domain limits when p_limited), run with EXECUTE so each call is planned with its real LIMIT.';

COMMENT ON FUNCTION mailroom._explain_claim(integer, boolean) IS
'Internal: EXPLAIN of the exact claim statement (pgTAP checks it uses the partial index).';
