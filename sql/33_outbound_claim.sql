-- claim_messages: one statement turns up to p_limit due rows into processing under a lease
-- (FOR UPDATE SKIP LOCKED over the partial index outbound_messages_due_idx, higher priority first,
-- then due order) and returns them in that order with their relay settings. The relay password comes back encrypted to the sender key (only the
-- sender can decrypt it); a token email is rendered here, with a freshly minted link and code
-- (sql/41: _claim_token_email), and exists in plaintext only in this result.
--
-- Static SQL throughout. What is due is written once, in the view _outbound_due; the claim
-- statement (_claim) takes the due rows either straight from it (no domain limit in force) or
-- through _claim_limited_due (docs/limits.md), then claims them and returns them with their relays. claim_messages chooses the plan mode: a small claim without limits runs the
-- statement's cached generic plan (planning is most of its cost); a big or a limited one is
-- planned with its real values at every call. _explain_claim shows the plans of the very text
-- that runs (_statement_of), which pgTAP 33 and 39 check.
--
-- The claim's row is one type, mailroom.claimed_message (migration 0250): _claim, its Citus form
-- (sql/citus/20_queue.sql), claim_messages and finalize_and_claim (sql/34) return it, and the
-- driver's declaration (outbound/sqlapi.py, CLAIMED_MESSAGE) is checked against it.

-- What is due: queued, and never tried or its retry time (or send_after) has come. coalesce()
-- is the expression of outbound_messages_due_idx, so a scan ordered by priority DESC, due_at, id
-- walks that partial index and stops after LIMIT rows, at any queue size. And made by then
-- (created_at <= clock, always so for a live worker): a session that pins the clock before an
-- installation existed (db verify's pgTAP files) meets its own rows alone, and never locks the
-- installation's (docs/operations.md, "Verifying an installation").
CREATE OR REPLACE VIEW mailroom._outbound_due AS
SELECT
    m.id,
    m.created_at,
    m.rcpt_domain,
    coalesce(m.next_retry_at, '-infinity'::timestamptz) AS due_at,
    m.priority
FROM mailroom.outbound_messages AS m
WHERE
    m.status = 'queued'
    AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= mailroom.clock()
    AND m.created_at <= mailroom.clock();

COMMENT ON VIEW mailroom._outbound_due IS
'Internal: the outbound messages due now (queued, retry time or send_after come, made by now), with priority and due_at: a claim takes them by priority DESC, due_at, id.';

-- The statement of a function that is one RETURN QUERY (the claim's): what _explain_claim
-- plans, so the checked plan is the plan of the text that runs.
CREATE OR REPLACE FUNCTION mailroom_internal._statement_of(p_function regprocedure)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (
        SELECT substring(p.prosrc FROM 'RETURN QUERY\s+(.*?);\s*END;\s*$')
        FROM pg_catalog.pg_proc AS p
        WHERE p.oid = p_function
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._statement_of(regprocedure) IS
'Internal: the RETURN QUERY statement of a PL/pgSQL function made of one (the claim''s), for EXPLAIN.';

-- Domain limits on (docs/limits.md, sql/39_outbound_domain_limits.sql): the due rows in due
-- order as without limits, but a capped domain gets at most the room _domain_room grants it,
-- under a per-domain lock that a concurrent claimer skips instead of waiting for; the claims of
-- per-minute capped domains are counted at once (the rows returned are locked by this
-- transaction, so the claim that follows takes every one of them). Planned at every call, with
-- the real limit and clock.
CREATE OR REPLACE FUNCTION mailroom_internal._claim_limited_due(p_now timestamptz, p_limit integer)
RETURNS TABLE (id bigint, created_at timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SET enable_hashjoin = off
SET enable_mergejoin = off
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH
blocked AS MATERIALIZED (
    -- domains that can get nothing now by this statement's snapshot (backed off, at the
    -- per-minute cap, or at the in-flight cap): a hint so the scan skips their rows. The
    -- decision that holds against concurrent claimers is _domain_room's, under the lock.
    SELECT b.domain FROM mailroom_internal._blocked_domains($1) AS b
),

head AS MATERIALIZED (
    -- the due rows in claim order (the same index scan as without limits), skipping blocked
    -- domains; twice the limit, so a capped domain's surplus leaves room for the others
    SELECT d.id, d.created_at, d.rcpt_domain, d.priority, d.due_at
    FROM mailroom._outbound_due AS d
    WHERE d.rcpt_domain <> ALL (ARRAY(SELECT b.domain FROM blocked AS b))
    ORDER BY d.priority DESC, d.due_at, d.id
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
            ELSE mailroom_internal._domain_room(d.domain, $1, l.max_in_flight, l.max_per_minute)
        END AS room
    FROM (SELECT DISTINCT h.rcpt_domain AS domain FROM head AS h) AS d
    LEFT JOIN LATERAL mailroom_internal._domain_limit(d.domain) AS l ON TRUE
),

due AS (
    SELECT r.id, r.created_at, r.rcpt_domain
    FROM (
        SELECT
            h.id,
            h.created_at,
            h.rcpt_domain,
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

counted AS (
    -- claims of per-minute capped domains, counted in the current minute (domain order, the
    -- order finalize writes domain_state in too)
    INSERT INTO mailroom.domain_state AS s (domain, window_start, window_count, updated_at)
    SELECT c.rcpt_domain, date_trunc('minute', $1), count(*), $1
    FROM due AS c
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
)

SELECT d.id, d.created_at FROM due AS d;
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._claim_limited_due(timestamptz, integer) IS
'Internal: the due rows a claim may take while domain limits are in force (caps, room under a per-domain lock, backoff), locked, their per-minute claims counted.';

CREATE OR REPLACE FUNCTION mailroom_internal._unerased(p_values text[], p_envelope text[])
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- p_values (one per element of p_envelope: the envelope itself, its return paths, its
    -- List-Unsubscribe values) without those at the positions of erased recipients (replaced in
    -- place by erasure, sql/07_erasure.sql). A claim calls this per row: one expression and no
    -- query when nothing was erased, the common case.
    IF p_values IS NULL OR p_envelope IS NULL
        OR strpos(array_to_string(p_envelope, ' '), 'erased:') = 0 THEN
        RETURN p_values;
    END IF;
    RETURN ARRAY(
        SELECT u.v
        FROM unnest(p_values, p_envelope) WITH ORDINALITY AS u (v, e, n)
        WHERE NOT mailroom_internal._is_erased_recipient(u.e)
        ORDER BY u.n
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._unerased(text[], text[]) IS
'Internal (claim): the values at the envelope positions that are not erased recipients (erasure replaces in place).';

-- The claim statement ($1 now, $2 limit, $3 worker, $4 lease, $5 domain limits in force):
-- the due rows from _outbound_due, or from _claim_limited_due, claimed under the lease.
-- jit = off for the reason given at finalize_messages.
-- Its Citus form: sql/citus/20_queue.sql replaces this whole body (mailroom.db.citus.WHOLE_OVERRIDES).
CREATE OR REPLACE FUNCTION mailroom_internal._claim(
    p_now timestamptz, p_limit integer, p_worker text, p_lease interval, p_limited boolean
)
RETURNS SETOF mailroom.claimed_message
LANGUAGE plpgsql
SET jit = off
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH plain AS (
        SELECT d.id, d.created_at
        FROM mailroom._outbound_due AS d
        WHERE NOT $5
        -- higher priority first, then due order: the order of outbound_messages_due_idx
        ORDER BY d.priority DESC, d.due_at, d.id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ),

    limited AS (
        SELECT l.id, l.created_at
        FROM mailroom_internal._claim_limited_due($1, $2) AS l
        WHERE $5
    ),

    due AS (
        SELECT p.id, p.created_at FROM plain AS p
        UNION ALL
        SELECT l.id, l.created_at FROM limited AS l
    ),

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
    relays AS MATERIALIZED (
        SELECT
            s.id,
            s.name,
            s.from_address,
            s.smtp_host,
            s.smtp_port,
            s.smtp_security,
            s.smtp_username,
            s.smtp_password_sealed,
            s.smtp_password_sealed IS NOT NULL OR s.smtp_password_encrypted IS NOT NULL AS smtp_password_set,
            s.smtp_allow_cleartext
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
        -- an erased recipient (sql/07_erasure.sql, in place) is in no header and gets nothing
        mailroom_internal._unerased(c.to_addrs, c.to_addrs),
        mailroom_internal._unerased(c.cc_addrs, c.cc_addrs),
        mailroom_internal._unerased(c.bcc_addrs, c.bcc_addrs),
        -- a token email (token_id): rendered for this attempt, with a fresh link
        coalesce(t.subject, c.subject),
        CASE WHEN c.token_id IS NULL THEN c.text_body ELSE t.text_body END,
        CASE WHEN c.token_id IS NULL THEN c.html_body ELSE t.html_body END,
        c.headers,
        c.created_at,
        c.possibly_sent,
        r.smtp_host,
        r.smtp_port,
        r.smtp_security,
        r.smtp_username,
        r.smtp_password_sealed,
        r.smtp_password_set,
        r.smtp_allow_cleartext,
        -- the VERP envelope senders (sql/36_outbound_bounces.sql), one per envelope recipient, NULL
        -- without a bounce domain; return_path (a sender of the previous release sends one
        -- transaction for all recipients) only when there is one recipient. Each signed value names
        -- its envelope position; an erased position is skipped (the values of the others keep
        -- their own positions: recipients[i] goes with return_paths[i] and list_unsubscribe[i])
        CASE WHEN cardinality(e.live) = 1 THEN p.paths[1] END AS return_path,
        e.live,
        p.paths,
        -- bulk mail: List-Unsubscribe per recipient (sql/36_outbound_unsubscribe.sql)
        CASE
            WHEN c.bulk THEN mailroom_internal._unerased(
                mailroom_internal._list_unsubscribe(c.id, c.sender_id, cardinality(e.envelope)), e.envelope
            )
        END,
        -- DKIM of the From domain (sql/30_outbound_dkim.sql): the sender signs with its private half
        k.domain,
        k.selector,
        k.public_key,
        k.algorithm,
        -- attachments (sql/32): base64 in JSON, for the messages that have any
        mailroom_internal._attachments_json(c.attachments),
        -- a released message (sql/32_outbound_release.sql): the bytes to send as they are
        c.raw_message,
        -- a webhook delivery (sql/38_outbound_webhooks.sql): its endpoint's URL and sealed secret
        -- (NULL once the endpoint is removed or its API key revoked: the sender fails it)
        c.kind,
        w.url,
        w.secret_sealed
    FROM claimed AS c
    -- a webhook row has no sender
    LEFT JOIN relays AS r ON c.sender_id = r.id
    LEFT JOIN mailroom.webhook_endpoints AS w ON c.kind = 'webhook' AND c.webhook_endpoint_id = w.id
        -- an endpoint of a revoked API key is as one removed: its queued deliveries fail ('local')
        AND NOT EXISTS (SELECT FROM mailroom.api_keys AS ak WHERE ak.id = w.key_id AND ak.revoked_at IS NOT NULL)
    CROSS JOIN LATERAL (
        SELECT x.envelope, mailroom_internal._unerased(x.envelope, x.envelope) AS live
        FROM (SELECT mailroom_internal._envelope(c.to_addrs, c.cc_addrs, c.bcc_addrs) AS envelope) AS x
    ) AS e
    CROSS JOIN LATERAL (
        SELECT mailroom_internal._unerased(mailroom_internal._return_paths(c.id, c.sender_id, cardinality(e.envelope)), e.envelope) AS paths
    ) AS p
    LEFT JOIN mailroom.dkim_keys AS k ON k.domain = mailroom_internal._address_domain(r.from_address)
    -- STRICT: no call for an application's message (token_id NULL)
    LEFT JOIN LATERAL mailroom_internal._claim_token_email(c.token_id) AS t ON TRUE
    -- the batch in the order it was claimed in (issue 34): higher priority first, then due order;
    -- the sender sends it in this order
    ORDER BY c.priority DESC, coalesce(c.next_retry_at, '-infinity'::timestamptz), c.id;
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._claim(timestamptz, integer, text, interval, boolean) IS
'Internal: the claim statement (due rows straight from _outbound_due, or through _claim_limited_due when p_limited), static; claim_messages chooses its plan mode.';

CREATE OR REPLACE FUNCTION mailroom.claim_messages(
    p_limit integer,
    p_worker text,
    p_lease interval DEFAULT null
)
RETURNS SETOF mailroom.claimed_message
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- outbound_messages is partitioned (issue 14): the claimed rows are found by a nested loop of
-- primary-key probes, each pruned at run time to one partition; a hash or merge join would
-- read every partition (the planner does not cost that pruning, so it is told).
SET enable_hashjoin = off
SET enable_mergejoin = off
-- the plan mode and the settings the generic plan is made under are chosen below, for this call
-- only (a SET clause restores them when the function returns)
SET plan_cache_mode = auto
SET enable_seqscan = on
SET enable_bitmapscan = on
SET enable_sort = on
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
    -- The lease (the setting outbound.lease unless given) and whether domain limits are in force,
    -- in one statement (on Citus each read of a reference table is a statement of its own on the
    -- coordinator). The domain limits (docs/limits.md) cost nothing while no limit is set and no
    -- domain is backed off: then the claim is the plain statement.
    SELECT
        coalesce(p_lease, (SELECT t.value FROM mailroom.settings AS t WHERE t.name = 'outbound.lease')::interval),
        EXISTS (
            SELECT 1 FROM mailroom.domain_limits AS l
            WHERE l.max_in_flight IS NOT NULL OR l.max_per_minute IS NOT NULL
        ) OR EXISTS (
            SELECT 1 FROM mailroom.domain_state AS s
            WHERE s.backoff_until > v_now
        )
    INTO v_lease, v_limited;
    IF v_lease IS NULL THEN
        -- the setting is gone: setting()'s MR001
        v_lease := mailroom.setting('outbound.lease')::interval;
    END IF;
    IF v_lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR322',
            MESSAGE = format('lease must be positive, got %s', v_lease);
    END IF;
    IF v_limited AND current_setting('transaction_isolation') <> 'read committed' THEN
        -- _domain_room counts under its lock with a fresh snapshot, which only READ COMMITTED has
        RAISE EXCEPTION USING
            ERRCODE = 'MR323',
            MESSAGE = 'claim_messages must run in READ COMMITTED while domain limits are set';
    END IF;

    IF NOT v_limited AND p_limit <= 100 THEN
        -- A small claim without limits: the generic plan, cached for the session (planning grows
        -- with the number of outbound partitions: 1.7 ms at 9 against 0.6 ms of execution for
        -- claim_messages(1), docs/benchmarks.md). A generic plan knows neither LIMIT nor the clock;
        -- these settings leave it one shape, the one a custom plan picks at any queue size (pgTAP 33
        -- checks it): the ordered scan of outbound_messages_due_idx that stops after LIMIT rows,
        -- primary-key lookups for the update.
        PERFORM
            pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true),
            pg_catalog.set_config('enable_seqscan', 'off', true),
            pg_catalog.set_config('enable_bitmapscan', 'off', true),
            pg_catalog.set_config('enable_sort', 'off', true);
    ELSE
        -- a big or a limited claim: planned with its real LIMIT and clock at every call (a generic
        -- plan costs LIMIT blind and can flip to a sequential scan and a sort on a big queue)
        PERFORM pg_catalog.set_config('plan_cache_mode', 'force_custom_plan', true);
    END IF;
    RETURN QUERY SELECT * FROM mailroom_internal._claim(v_now, p_limit, p_worker, v_lease, v_limited);
END;
$$;

COMMENT ON FUNCTION mailroom.claim_messages(integer, text, interval) IS
'Claim up to p_limit due queued messages (SKIP LOCKED) under a lease; returns them with relay settings (the password '
'encrypted to the sender key), token emails rendered with a freshly minted link, the envelope with one VERP return path '
'and (bulk mail) one List-Unsubscribe value per recipient, and the From domain''s DKIM selector. Errors: MR320 limit, MR321 worker, '
'MR322 lease, MR323 not READ COMMITTED under domain limits.';

GRANT EXECUTE ON FUNCTION mailroom.claim_messages(integer, text, interval) TO mailroom_sender;

-- The keyed form of the previous release, for one release (no defaults, so a call without a key
-- is the form above): a sender not restarted yet gets the password decrypted with its key while
-- the previous release's ciphertext remains (until convert_sender_passwords), and never a login
-- the relay would receive over cleartext unless allowed.
CREATE OR REPLACE FUNCTION mailroom.claim_messages(
    p_limit integer,
    p_worker text,
    p_key bytea,
    p_lease interval
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
AS $$
BEGIN
    PERFORM mailroom_internal._check_outbound_key(p_key);
    RETURN QUERY
    SELECT
        n.id, n.claim_token, n.attempts, n.message_id, n.sender_name, n.from_address, n.to_addrs, n.cc_addrs,
        n.bcc_addrs, n.subject, n.text_body, n.html_body, n.headers, n.created_at, n.possibly_sent, n.smtp_host,
        n.smtp_port, n.smtp_security,
        CASE WHEN n.smtp_security <> 'none' OR n.smtp_allow_cleartext THEN n.smtp_username END,
        CASE
            WHEN n.smtp_security <> 'none' OR n.smtp_allow_cleartext
                THEN mailroom_internal._smtp_password(s.smtp_password_encrypted, p_key, s.name)
        END,
        n.smtp_password_set, n.return_path
    FROM mailroom.claim_messages(p_limit, p_worker, p_lease) AS n
    INNER JOIN mailroom.senders AS s ON n.sender_name = s.name
    ORDER BY n.id;
END;
$$;

COMMENT ON FUNCTION mailroom.claim_messages(integer, text, bytea, interval) IS
'Deprecated since 0.2.0, removed in 0.3.0: claim_messages(p_limit, p_worker, p_lease) with the password decrypted by the '
'passed key (previous release''s ciphertext only). Errors: MR314/MR315 key.';

GRANT EXECUTE ON FUNCTION mailroom.claim_messages(integer, text, bytea, interval) TO mailroom_sender;

CREATE OR REPLACE FUNCTION mailroom_internal._explain_claim(p_limit integer DEFAULT 100, p_limited boolean DEFAULT false)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- planned as claim_messages plans it
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    -- EXPLAIN without ANALYZE of the statements that run (their text, read from the functions):
    -- the claim, and with limits the due rows' statement it calls. Plans, changes nothing.
    RETURN QUERY EXECUTE 'EXPLAIN ' || mailroom_internal._statement_of(
        'mailroom_internal._claim(timestamptz, integer, text, interval, boolean)'::regprocedure
    )
    USING mailroom.clock(), p_limit, 'explain', interval '5 minutes', p_limited;
    IF p_limited THEN
        RETURN QUERY EXECUTE 'EXPLAIN ' || mailroom_internal._statement_of(
            'mailroom_internal._claim_limited_due(timestamptz, integer)'::regprocedure
        )
        USING mailroom.clock(), p_limit;
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._explain_claim(integer, boolean) IS
'Internal: EXPLAIN of the claim statements that run (pgTAP checks they use the partial index).';
