-- finalize_messages (many outcomes in one statement, fenced on the claim token),
-- release_messages (give claimed rows back untouched) and reap_stuck_messages (take back
-- rows whose worker went silent). The retry policy is read from mailroom.settings.

CREATE OR REPLACE FUNCTION mailroom_internal._classify_outcome(
    p_outcome text, p_smtp_code integer, p_enhanced_code text
)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- sent | transient | permanent. An SMTP reply is classified by its RFC 3463 enhanced
    -- code when it carries a valid one (4.x.x transient, 5.x.x permanent), else by the
    -- RFC 5321 reply code (5yz permanent, anything else transient). A lost connection,
    -- a timeout, a refused connection or an uncertain end of DATA is transient; a message
    -- the driver cannot build ('local') is permanent. A webhook's HTTP answer ('http', its status
    -- in p_smtp_code): 2xx sent, 4xx but 408 and 429 permanent (as an SMTP 5xx), else transient.
    -- PL/pgSQL, not SQL: a SQL function with SET search_path is never inlined, and its body
    -- is parsed and planned again in every statement that calls it (about 50 us each time,
    -- a fifth of a one-message finalize); PL/pgSQL keeps its compiled form for the session.
    RETURN CASE
        WHEN p_outcome = 'sent' THEN 'sent'
        WHEN p_outcome = 'reply' THEN
            CASE
                WHEN p_enhanced_code ~ '^5[.][0-9]{1,3}[.][0-9]{1,3}$' THEN 'permanent'
                WHEN p_enhanced_code ~ '^4[.][0-9]{1,3}[.][0-9]{1,3}$' THEN 'transient'
                WHEN p_smtp_code BETWEEN 500 AND 599 THEN 'permanent'
                ELSE 'transient'
            END
        WHEN p_outcome = 'local' THEN 'permanent'
        WHEN p_outcome = 'http' THEN
            CASE
                WHEN p_smtp_code BETWEEN 200 AND 299 THEN 'sent'
                WHEN p_smtp_code BETWEEN 400 AND 499 AND p_smtp_code NOT IN (408, 429) THEN 'permanent'
                ELSE 'transient'
            END
        ELSE 'transient'
    END;
END;
$$;

CREATE OR REPLACE FUNCTION mailroom_internal._retry_delay(
    p_attempts integer, p_base interval, p_exponent double precision, p_max interval
)
RETURNS interval
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- base * attempts ^ exponent, at most max (defaults: attempts² minutes). IMMUTABLE, the
    -- settings being arguments: finalize_messages calls it per row of a distributed UPDATE on
    -- Citus, which refuses a STABLE function with a column reference there (docs/scale.md).
    SELECT least(p_max, p_base * power(p_attempts, p_exponent));
$$;

COMMENT ON FUNCTION mailroom_internal._retry_delay(integer, interval, double precision, interval) IS
'Internal: delay before retry number p_attempts: least(p_max, p_base * p_attempts ^ p_exponent).';

CREATE OR REPLACE FUNCTION mailroom_internal._retry_delay(p_attempts integer)
RETURNS interval
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailroom_internal._retry_delay(
        p_attempts,
        mailroom.setting('outbound.backoff_base')::interval,
        mailroom.setting('outbound.backoff_exponent')::double precision,
        mailroom.setting('outbound.backoff_max')::interval
    );
$$;

COMMENT ON FUNCTION mailroom_internal._retry_delay(integer) IS
'Internal: delay before retry number p_attempts, per settings outbound.backoff_*.';

CREATE OR REPLACE FUNCTION mailroom_internal._log_line(
    p_now timestamptz, p_attempt integer, p_outcome text, p_text text
)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT to_char(p_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
        || ' attempt ' || p_attempt || ' ' || p_outcome
        || coalesce(': ' || left(regexp_replace(p_text, '[\r\n]+', ' ', 'g'), 1000), '');
$$;

CREATE OR REPLACE FUNCTION mailroom_internal._gives_up(p_kind text, p_attempt integer, p_max_attempts integer)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- A transient outcome (or a reaped claim) retries until attempt number outbound.max_attempts;
    -- that attempt fails the message. Sent and permanent outcomes never "give up". The setting
    -- counts attempts in all: its default 11 (migration 0191) is the seed's "retry up to 10
    -- times", the first attempt and up to 10 retries (docs/outbound.md).
    SELECT p_kind = 'transient' AND p_attempt >= p_max_attempts;
$$;

CREATE OR REPLACE FUNCTION mailroom_internal._attempt_log(
    p_log text,
    p_now timestamptz,
    p_attempt integer,
    p_outcome text,
    p_text text,
    p_kind text,
    p_max_attempts integer,
    p_max_chars integer
)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- error_log after one attempt: the attempt's line, then the give-up line when this attempt
    -- exhausted outbound.max_attempts; only the last p_max_chars characters are kept.
    SELECT right(
        concat_ws(
            E'\n',
            p_log,
            mailroom_internal._log_line(p_now, p_attempt, p_outcome, p_text),
            CASE
                WHEN mailroom_internal._gives_up(p_kind, p_attempt, p_max_attempts)
                    THEN 'giving up after ' || p_attempt || ' attempts (outbound.max_attempts)'
            END
        ),
        p_max_chars
    );
$$;

CREATE OR REPLACE FUNCTION mailroom_internal._reply_class(p_outcome text, p_code integer)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The class a delivery outcome is counted under (a closed set, safe as a metric label):
    -- 2xx for sent, 4xx / 5xx for an SMTP reply by its reply code (other for a reply without a
    -- 4yz or 5yz code), the outcome itself for dropped, timeout, connect, uncertain and local,
    -- other for anything else. PL/pgSQL for the reason given at _classify_outcome.
    RETURN CASE
        WHEN p_outcome = 'sent' THEN '2xx'
        WHEN p_outcome IN ('reply', 'http') THEN
            CASE
                WHEN p_code BETWEEN 200 AND 299 AND p_outcome = 'http' THEN '2xx'
                WHEN p_code BETWEEN 400 AND 499 THEN '4xx'
                WHEN p_code BETWEEN 500 AND 599 THEN '5xx'
                ELSE 'other'
            END
        WHEN p_outcome IN ('dropped', 'timeout', 'connect', 'uncertain', 'local') THEN p_outcome
        ELSE 'other'
    END;
END;
$$;

-- Add p_n to an outbound counter (outbound_counters, read by queue_stats), writing nothing when
-- p_n is 0; returns p_n.
CREATE OR REPLACE FUNCTION mailroom_internal._count_outbound(p_name text, p_n bigint)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_n > 0 THEN
        UPDATE mailroom.outbound_counters AS k SET value = k.value + p_n WHERE k.name = p_name;
    END IF;
    RETURN p_n;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._count_outbound(text, bigint) IS
'Internal: add p_n to the outbound counter p_name when p_n > 0 (no write at 0); returns p_n.';

-- A Citus seam (mailroom.db.citus.SEAMS): the lanes of outbound_messages that rows claimed under
-- these claim tokens are in, or NULL for "any". One node is one lane (every row's lane is 0): NULL.
-- Its Citus form: sql/citus/05_lanes.sql, where a claim token carries the lane it was taken from,
-- so the statements that act on a claim's rows by id (finalize, release) name that lane and Citus
-- writes its shard alone, not every shard (a two-phase commit of every worker, docs/scale.md).
CREATE OR REPLACE FUNCTION mailroom_internal._claim_lanes(p_claim_tokens bigint[])
RETURNS integer[]
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT null::integer[]
$$;

COMMENT ON FUNCTION mailroom_internal._claim_lanes(bigint[]) IS
'Internal (a Citus seam): the lanes rows claimed under these tokens are in, NULL for any (one node: NULL; Citus: the lanes the tokens carry).';

CREATE OR REPLACE FUNCTION mailroom.finalize_messages(
    p_ids bigint[],
    p_claim_tokens bigint[],
    p_outcomes text[],
    p_smtp_codes integer[] DEFAULT null,
    p_enhanced_codes text[] DEFAULT null,
    p_errors text[] DEFAULT null
)
RETURNS TABLE (
    id bigint,
    result text,
    status mailroom.outbound_status,
    attempts integer,
    next_retry_at timestamptz,
    kind text,
    reply_class text
)
LANGUAGE plpgsql
-- The batch join must stay linear at any table size. Statistics usually say "nothing is
-- processing", so the planner expects ~1 matching row and picks either a sequential scan of the
-- whole queue or a nested loop over the whole input per row (quadratic in the batch). Measured
-- at 100k rows, batch 500: 55-125 ms per call instead of ~10 ms. With these two settings every
-- plan, custom or cached generic, is primary-key lookups (id = ANY) + a hash join.
-- A disabled plan node costs 1e10, far above jit_above_cost: any nested query that has no other
-- plan (the error_log trigger's, for one) would be JIT-compiled on every call, about 70 ms each.
-- jit = off keeps the settings above from costing more than the plans they fix.
SET enable_seqscan = off
SET enable_nestloop = off
SET jit = off
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := mailroom.clock();
    v_n integer := coalesce(cardinality(p_ids), 0);
    -- one read of the settings (on Citus every read of a reference table is a statement of its own)
    v_settings text[] := mailroom_internal._settings(ARRAY[
        'outbound.max_attempts', 'outbound.error_log_max_chars', 'outbound.backoff_base',
        'outbound.backoff_exponent', 'outbound.backoff_max'
    ]);
    v_max integer := v_settings[1]::integer;
    v_log_max integer := v_settings[2]::integer;
    v_backoff_base interval := v_settings[3]::interval;
    v_backoff_exponent double precision := v_settings[4]::double precision;
    v_backoff_max interval := v_settings[5]::interval;
    -- whether any domain has a backoff a success could clear (else a success writes nothing), and
    -- whether a sender has a webhook endpoint (sql/38_outbound_webhooks.sql: else no event is looked
    -- for); one statement (BEGIN below)
    v_backoffs boolean;
    v_hooks boolean;
    -- webhook deliveries reported with an SMTP outcome (reply, refused) or 'local' while their
    -- endpoint is still there: a sender of the previous release, which takes a webhook row for mail
    -- it cannot send; retried, so a sender of this release takes it (docs/webhooks.md, Upgrading).
    -- Looked for only when such an outcome comes and an endpoint exists (BEGIN below: no statement
    -- at all for a batch without such an outcome). This release's sender answers a webhook with
    -- 'http' or a connection's outcome, and 'local' only for a removed endpoint.
    v_odd_hooks bigint[] := '{}';
    -- messages every recipient of which the relay refused at RCPT
    v_refused bigint[] := ARRAY(SELECT u.i FROM unnest(p_ids, p_outcomes) AS u (i, o) WHERE u.o = 'refused');
    -- the lanes the claim tokens name (_claim_lanes, a seam: NULL on one node, where the queue is
    -- one lane; on Citus one shard a lane, so a batch claimed from one lane is written there alone)
    v_lanes integer[] := mailroom_internal._claim_lanes(p_claim_tokens);
    -- the refusals that govern the refused messages (id, code, enhanced code)
    v_g_ids bigint[];
    v_g_codes integer[];
    v_g_enhanced text[];
    -- each input's outcome ('refused' as 'reply'), codes, kind and reply class, in p_ids order
    v_outcomes text[];
    v_codes integer[];
    v_enhanced text[];
    v_kinds text[];
    v_classes text[];
    -- the rows written, and what they lead to besides themselves
    r record;
    v_upd_ids bigint[] := '{}';
    v_upd_status mailroom.outbound_status[] := '{}';
    v_upd_attempts integer[] := '{}';
    v_upd_next timestamptz[] := '{}';
    v_live text[];
    v_bounce_ids bigint[] := '{}';
    v_bounce_to text[] := '{}';
    v_throttled text[] := '{}';
    v_succeeded text[] := '{}';
    v_events jsonb[] := '{}';
    v_duplicates bigint := 0;
BEGIN
    SELECT
        EXISTS (SELECT 1 FROM mailroom.domain_state AS s WHERE s.backoff_until IS NOT NULL),
        EXISTS (SELECT 1 FROM mailroom.webhook_endpoints AS w WHERE w.sender_id IS NOT NULL)
    INTO v_backoffs, v_hooks;
    IF p_outcomes && ARRAY['local', 'reply', 'refused'] THEN
        v_odd_hooks := CASE
            WHEN EXISTS (SELECT 1 FROM mailroom.webhook_endpoints AS e) THEN ARRAY(
                -- a join with the endpoints (a reference table on Citus), not a correlated subquery
                SELECT m.id FROM mailroom.outbound_messages AS m
                INNER JOIN mailroom.webhook_endpoints AS w ON m.webhook_endpoint_id = w.id
                WHERE m.id = ANY (p_ids) AND m.kind = 'webhook'
            ) ELSE '{}'
        END;
    END IF;
    IF p_ids IS NULL OR p_claim_tokens IS NULL OR p_outcomes IS NULL
        OR cardinality(p_claim_tokens) <> v_n
        OR cardinality(p_outcomes) <> v_n
        OR coalesce(cardinality(p_smtp_codes), v_n) NOT IN (0, v_n)
        OR coalesce(cardinality(p_enhanced_codes), v_n) NOT IN (0, v_n)
        OR coalesce(cardinality(p_errors), v_n) NOT IN (0, v_n) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR330',
            MESSAGE = 'finalize arrays must be non-NULL and of equal length (ids, claim tokens, outcomes[, codes, enhanced codes, errors])';
    END IF;
    IF EXISTS (
        SELECT 1
        FROM unnest(p_ids, p_claim_tokens, p_outcomes) AS u (i, t, o)
        WHERE u.i IS NULL OR u.t IS NULL OR u.o IS NULL
            OR u.o NOT IN ('sent', 'reply', 'refused', 'dropped', 'timeout', 'connect', 'uncertain', 'local', 'http')
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR331',
            MESSAGE = 'each outcome needs an id, a claim token and one of: sent, reply, refused, dropped, timeout, connect, uncertain, local, http';
    END IF;
    IF (SELECT count(DISTINCT u.i) FROM unnest(p_ids) AS u (i)) <> v_n THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR332',
            MESSAGE = 'a message id appears more than once in one finalize call';
    END IF;

    -- The statements below are plain ones, each planned on its own: the UPDATE is the only one that
    -- reads or writes the queue, and what the outcomes lead to besides the rows is done only when
    -- there is some. On Citus a data-modifying CTE is a subplan whose rows come back as an
    -- intermediate result that the coordinator then runs the rest of the statement over: as one
    -- statement of CTEs, a finalize of 10 cost the coordinator 7.4 ms of CPU, planning (41 %) and
    -- running those subplans (40 %) (issue 46); the UPDATE alone is routed to the claim's shard.
    IF cardinality(v_refused) > 0 THEN
        -- 'refused' (the relay refused every recipient at RCPT): of the refusals
        -- record_refused_recipients recorded under this claim, the most hopeful one governs, a
        -- transient reply first (the message is retried while any recipient may still take it).
        -- The outcome is then that reply's; none recorded: a reply without a code (transient).
        SELECT array_agg(g.message_id), array_agg(g.smtp_code), array_agg(g.enhanced_code)
        INTO v_g_ids, v_g_codes, v_g_enhanced
        FROM (
            SELECT DISTINCT ON (b.message_id) b.message_id, b.smtp_code, b.status AS enhanced_code
            FROM mailroom.outbound_bounces AS b
            WHERE
                b.message_id = any(v_refused)
                AND b.action = 'refused'
                AND (b.message_id, b.claim_token) IN (
                    SELECT u.id, u.claim_token FROM unnest(p_ids, p_claim_tokens) AS u (id, claim_token)
                )
            ORDER BY
                b.message_id,
                mailroom_internal._classify_outcome('reply', b.smtp_code, b.status) = 'transient' DESC,
                b.id
        ) AS g;
    END IF;

    -- what each outcome is (no table: computed here, in the order of p_ids)
    SELECT
        array_agg(x.outcome ORDER BY x.n),
        array_agg(x.smtp_code ORDER BY x.n),
        array_agg(x.enhanced_code ORDER BY x.n),
        array_agg(
            CASE
                WHEN x.outcome IN ('local', 'reply') AND x.id = any(v_odd_hooks) THEN 'transient'
                ELSE mailroom_internal._classify_outcome(x.outcome, x.smtp_code, x.enhanced_code)
            END
            ORDER BY x.n
        ),
        array_agg(mailroom_internal._reply_class(x.outcome, x.smtp_code) ORDER BY x.n)
    INTO v_outcomes, v_codes, v_enhanced, v_kinds, v_classes
    FROM (
        SELECT
            u.n,
            u.id,
            CASE WHEN u.outcome = 'refused' THEN 'reply' ELSE u.outcome END AS outcome,
            coalesce(u.smtp_code, g.smtp_code) AS smtp_code,
            coalesce(u.enhanced_code, g.enhanced_code) AS enhanced_code
        FROM unnest(p_ids, p_outcomes, p_smtp_codes, p_enhanced_codes)
            WITH ORDINALITY AS u (id, outcome, smtp_code, enhanced_code, n)
        LEFT JOIN unnest(v_g_ids, v_g_codes, v_g_enhanced) AS g (message_id, smtp_code, enhanced_code)
            ON u.id = g.message_id
    ) AS x;

    FOR r IN
        UPDATE mailroom.outbound_messages AS m
        SET
            -- a row the reaper took back (still queued, same token) only accepts 'sent'
            attempts = CASE WHEN m.status = 'processing' THEN m.attempts + 1 ELSE m.attempts END,
            status = CASE
                WHEN i.kind = 'sent' THEN 'sent'
                WHEN i.kind = 'permanent' THEN 'failed'
                WHEN mailroom_internal._gives_up(i.kind, m.attempts + 1, v_max) THEN 'failed'
                ELSE 'queued'
            END::mailroom.outbound_status,
            next_retry_at = CASE
                WHEN i.kind = 'transient' AND NOT mailroom_internal._gives_up(i.kind, m.attempts + 1, v_max)
                    THEN mailroom_internal._later(v_now, mailroom_internal._retry_delay(m.attempts + 1, v_backoff_base, v_backoff_exponent, v_backoff_max))
            END,
            sent_at = CASE WHEN i.kind = 'sent' THEN v_now END,
            last_outcome = i.outcome,
            last_smtp_code = i.smtp_code,
            last_enhanced_code = i.enhanced_code,
            possibly_sent = m.possibly_sent OR i.outcome = 'uncertain',
            error_log = CASE
                WHEN i.kind = 'sent' AND i.error IS NULL THEN m.error_log
                ELSE mailroom_internal._attempt_log(
                    m.error_log, v_now, m.attempts + 1, i.outcome, i.error, i.kind, v_max, v_log_max
                )
            END,
            claimed_by = NULL,
            claim_token = NULL,
            lease_expires_at = NULL,
            updated_at = v_now
        FROM unnest(p_ids, p_claim_tokens, v_outcomes, v_codes, v_enhanced, p_errors, v_kinds)
            AS i (id, claim_token, outcome, smtp_code, enhanced_code, error, kind)
        WHERE
            m.id = i.id
            -- an index condition the planner estimates right (a hash join over a seq scan of
            -- the whole table is what it picks otherwise when statistics say "no processing rows")
            AND m.id = any(p_ids)
            AND (v_lanes IS NULL OR m.lane = any(v_lanes))
            AND m.claim_token = i.claim_token
            -- processing, or (a reaped row) queued, possibly sent and now sent. Written as a list
            -- and a second condition, not as "status = 'processing' OR (status = 'queued' AND …)":
            -- the planner turned that OR into a BitmapOr over the partial indexes of each status,
            -- and the queued one's is the due index, walked whole for "id = ANY" (on a burst
            -- enqueued a moment before, 10,000 queued rows without statistics: ~10 ms a finalize
            -- of 50, the call's largest part; issue 37). The list matches no partial index: the
            -- rows are primary-key probes.
            AND m.status IN ('processing', 'queued')
            AND (m.status <> 'queued' OR (m.possibly_sent AND i.kind = 'sent'))
        RETURNING
            m.id, m.status, m.attempts, m.next_retry_at, m.to_addrs, m.cc_addrs, m.bcc_addrs, m.rcpt_domain,
            m.kind, m.sender_id, m.message_id, m.possibly_sent, m.last_smtp_code, m.last_enhanced_code,
            m.sent_at, i.outcome, i.kind AS verdict, i.smtp_code, i.enhanced_code, i.error
    LOOP
        v_upd_ids := array_append(v_upd_ids, r.id);
        v_upd_status := array_append(v_upd_status, r.status);
        v_upd_attempts := array_append(v_upd_attempts, r.attempts);
        v_upd_next := array_append(v_upd_next, r.next_retry_at);
        -- A synchronous 5xx (a permanent reply) to a message with one live recipient is a hard
        -- bounce of that recipient: onto the suppression list (sql/38) with this message's id. With
        -- several recipients the reply does not say which one failed: nothing is added. An erased
        -- recipient keeps its position in the arrays (sql/07_erasure.sql) but was never mailed: it
        -- is not counted. A refusal at RCPT was suppressed by record_refused_recipients already.
        IF r.outcome = 'reply' AND r.verdict = 'permanent' AND r.status = 'failed' AND NOT (r.id = any(v_refused)) THEN
            v_live := ARRAY(
                SELECT a.v FROM unnest(r.to_addrs || r.cc_addrs || r.bcc_addrs) AS a (v)
                WHERE NOT mailroom_internal._is_erased_recipient(a.v)
            );
            IF cardinality(v_live) = 1 THEN
                v_bounce_ids := array_append(v_bounce_ids, r.id);
                v_bounce_to := array_append(v_bounce_to, v_live[1]);
            END IF;
        END IF;
        -- The domain backoff (sql/39_outbound_domain_limits.sql, docs/limits.md): a reply that says
        -- the recipient domain is throttling us (421, 4.7.x, greylisting) backs that domain off, so
        -- claim skips its messages until then; an accepted message clears it. Other domains and the
        -- message's own retry (attempts² above) are not touched.
        IF r.verdict = 'transient' AND mailroom_internal._is_domain_throttle(r.outcome, r.smtp_code, r.enhanced_code, r.error) THEN
            v_throttled := array_append(v_throttled, r.rcpt_domain);
        ELSIF r.verdict = 'sent' AND v_backoffs THEN
            v_succeeded := array_append(v_succeeded, r.rcpt_domain);
        END IF;
        -- Webhooks (sql/38_outbound_webhooks.sql): a mail's end (sent, failed) queues message.sent
        -- or message.failed for its sender's endpoints, in this transaction; nothing is looked for
        -- while no sender has one.
        IF v_hooks AND r.kind = 'mail' AND r.status IN ('sent', 'failed') THEN
            v_events := array_append(v_events, jsonb_build_object(
                'id', r.id, 'sender_id', r.sender_id, 'status', r.status, 'message_id', r.message_id,
                'attempts', r.attempts, 'smtp_code', r.last_smtp_code, 'enhanced_code', r.last_enhanced_code,
                'sent_at', r.sent_at
            ));
        END IF;
        -- A webhook delivered after a lost answer (reaped, possibly sent) is counted: its receiver
        -- may have it twice (the same webhook-id).
        IF r.kind = 'webhook' AND r.status = 'sent' AND r.possibly_sent THEN
            v_duplicates := v_duplicates + 1;
        END IF;
    END LOOP;

    -- What the batch's outcomes lead to besides the rows, in this order, each only when there is
    -- something to do: hard bounces, domain backoffs, webhook events (in id order), the counters
    -- (on Citus an UPDATE of them, even of no row, is a write on the coordinator, and the batch's
    -- commit would then be a two-phase one: the worker's and the coordinator's).
    FOR k IN 1 .. cardinality(v_bounce_ids) LOOP
        PERFORM mailroom_internal._add_suppression(v_bounce_to[k], 'hard_bounce', NULL, v_bounce_ids[k]);
    END LOOP;
    IF cardinality(v_throttled) > 0 OR cardinality(v_succeeded) > 0 THEN
        PERFORM mailroom_internal._note_domain_outcomes(v_now, v_throttled, v_succeeded);
    END IF;
    IF cardinality(v_events) > 0 THEN
        PERFORM mailroom_internal._webhook_outcomes(
            ARRAY(SELECT e.v FROM unnest(v_events) AS e (v) ORDER BY (e.v ->> 'id')::bigint)
        );
    END IF;
    IF v_duplicates > 0 THEN
        PERFORM mailroom_internal._count_outbound('webhook_possible_duplicates', v_duplicates);
    END IF;
    IF v_n > cardinality(v_upd_ids) THEN
        PERFORM mailroom_internal._count_outbound('stale_outcomes', v_n - cardinality(v_upd_ids));
    END IF;

    RETURN QUERY
    SELECT
        i.id,
        CASE
            WHEN u.id IS NULL THEN 'stale'
            WHEN u.status = 'sent' THEN 'sent'
            WHEN u.status = 'failed' THEN 'failed'
            ELSE 'retry'
        END,
        u.status,
        u.attempts,
        u.next_retry_at,
        i.kind,
        i.reply_class
    FROM unnest(p_ids, v_kinds, v_classes) AS i (id, kind, reply_class)
    LEFT JOIN unnest(v_upd_ids, v_upd_status, v_upd_attempts, v_upd_next) AS u (id, status, attempts, next_retry_at)
        ON i.id = u.id
    ORDER BY i.id;
END;
$$;

COMMENT ON FUNCTION mailroom.finalize_messages(bigint[], bigint[], text[], integer[], text[], text[]) IS
'Record many delivery outcomes at once: sent, retry with backoff, or failed; outcomes from a lost claim are ignored (stale); for refused (every recipient refused at RCPT) the governing refusal is chosen here. Each row also says the kind decided (sent, transient, permanent) and the reply class for metrics. Errors: MR330 arrays, MR331 unknown outcome, MR332 duplicate id.';

GRANT EXECUTE ON FUNCTION mailroom.finalize_messages(bigint[], bigint[], text[], integer[], text[], text[]) TO mailroom_sender;

-- finalize_and_claim (issue 37, item 5): a sender that keeps going reports its batch and takes
-- the next one in one round trip and one commit. Nothing of its own: finalize_messages, then
-- claim_messages, in one transaction, so every guarantee of the two holds as if called in turn
-- (the claim-token fence, stale outcomes, priorities, domain limits with the in-flight counts and
-- backoffs the finalize just left, the reaper's takeover). A failing claim (MR320-MR323) rolls
-- the finalize back with it: the caller finalizes again, which the fence makes safe.
CREATE OR REPLACE FUNCTION mailroom.finalize_and_claim(
    p_limit integer,
    p_worker text,
    p_ids bigint[],
    p_claim_tokens bigint[],
    p_outcomes text[],
    p_smtp_codes integer[] DEFAULT null,
    p_enhanced_codes text[] DEFAULT null,
    p_errors text[] DEFAULT null,
    p_lease interval DEFAULT null
)
RETURNS TABLE (
    id bigint,
    result text,
    attempts integer,
    next_retry_at timestamptz,
    reply_class text,
    message mailroom.claimed_message
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- one row per outcome (message NULL), as finalize_messages answers it, in id order
    RETURN QUERY
    SELECT f.id, f.result, f.attempts, f.next_retry_at, f.reply_class, NULL::mailroom.claimed_message
    FROM mailroom.finalize_messages(
        p_ids, p_claim_tokens, p_outcomes, p_smtp_codes, p_enhanced_codes, p_errors
    ) AS f;
    -- then one row per claimed message (the outcome columns NULL), in the order to send them
    RETURN QUERY
    SELECT NULL::bigint, NULL::text, NULL::integer, NULL::timestamptz, NULL::text, c
    FROM mailroom.claim_messages(p_limit, p_worker, p_lease) AS c;
END;
$$;

COMMENT ON FUNCTION mailroom.finalize_and_claim(integer, text, bigint[], bigint[], text[], integer[], text[], text[], interval) IS
'finalize_messages then claim_messages in one transaction (one round trip, one commit): the outcome rows (message NULL), then the claimed rows (message, the claim''s row). Errors: those of the two (MR320-MR323, MR330-MR332).';

GRANT EXECUTE ON FUNCTION mailroom.finalize_and_claim(integer, text, bigint[], bigint[], text[], integer[], text[], text[], interval) TO mailroom_sender;

CREATE OR REPLACE FUNCTION mailroom.release_messages(p_ids bigint[], p_claim_tokens bigint[])
RETURNS integer
LANGUAGE plpgsql
-- the same planner settings as finalize_messages, for the same reasons
SET enable_seqscan = off
SET enable_nestloop = off
SET jit = off
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer;
    v_lanes integer[] := mailroom_internal._claim_lanes(p_claim_tokens);
BEGIN
    IF p_ids IS NULL OR p_claim_tokens IS NULL
        OR cardinality(p_ids) <> cardinality(p_claim_tokens) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR330',
            MESSAGE = 'release arrays must be non-NULL and of equal length (ids, claim tokens)';
    END IF;
    UPDATE mailroom.outbound_messages AS m
    SET
        status = 'queued',
        claimed_by = NULL,
        claim_token = NULL,
        lease_expires_at = NULL,
        updated_at = mailroom.clock()
    FROM unnest(p_ids, p_claim_tokens) AS u (id, claim_token)
    WHERE
        m.id = u.id
        AND m.id = any(p_ids)
        AND (v_lanes IS NULL OR m.lane = any(v_lanes))
        AND m.claim_token = u.claim_token
        AND m.status = 'processing';
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom.release_messages(bigint[], bigint[]) IS
'Give claimed, unattempted messages back to the queue (no attempt counted); returns how many. Errors: MR330 arrays.';

GRANT EXECUTE ON FUNCTION mailroom.release_messages(bigint[], bigint[]) TO mailroom_sender;

-- A Citus seam (mailroom.db.citus.SEAMS): the parts of outbound_messages a statement that locks
-- with SKIP LOCKED runs on, as a condition on alias m. One on one node ('true'); on Citus
-- (sql/citus/20_queue.sql) one a lane, in random order: SKIP LOCKED runs only in a single-shard
-- statement, and a lane written into the statement's text routes it to its shard.
CREATE OR REPLACE FUNCTION mailroom_internal._outbound_scopes()
RETURNS SETOF text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN NEXT 'true';
END;
$$;

COMMENT ON FUNCTION mailroom_internal._outbound_scopes() IS
'Internal (a Citus seam): conditions on outbound_messages AS m that together cover it, one statement each (one node: true; Citus: a lane each).';

CREATE OR REPLACE FUNCTION mailroom.reap_stuck_messages(p_older_than interval DEFAULT null)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_max integer := mailroom.setting('outbound.max_attempts')::integer;
    v_log_max integer := mailroom.setting('outbound.error_log_max_chars')::integer;
    v_scope text;
    v_got integer;
    v_count integer := 0;
BEGIN
    IF p_older_than < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR333',
            MESSAGE = format('reap interval must not be negative, got %s', p_older_than);
    END IF;
    -- one statement on one node; on Citus one a lane (_outbound_scopes, the seam)
    FOR v_scope IN SELECT s.scope FROM mailroom_internal._outbound_scopes() AS s (scope) LOOP
        -- The worker may have handed the message to the relay before it died: count the
        -- attempt as a transient failure, flag possibly_sent, retry at once (the stable Message-ID lets receivers
        -- de-duplicate). The claim token is kept so a late 'sent' from that worker still lands.
        -- $1 now, $2 p_older_than, $3 outbound.max_attempts, $4 outbound.error_log_max_chars.
        EXECUTE format($q$
        WITH stuck AS (
            SELECT m.id
            FROM mailroom.outbound_messages AS m
            WHERE
                %1$s
                AND m.status = 'processing'
                AND (
                    m.lease_expires_at <= $1
                    OR m.claimed_at <= $1 - $2
                )
            FOR UPDATE SKIP LOCKED
        ),

        reaped AS (
            UPDATE mailroom.outbound_messages AS m
            SET
                attempts = m.attempts + 1,
                status = CASE
                    WHEN mailroom_internal._gives_up('transient', m.attempts + 1, $3) THEN 'failed' ELSE 'queued'
                END::mailroom.outbound_status,
                next_retry_at = CASE WHEN NOT mailroom_internal._gives_up('transient', m.attempts + 1, $3) THEN $1 END,
                possibly_sent = TRUE,
                claimed_by = NULL,
                lease_expires_at = NULL,
                error_log = mailroom_internal._attempt_log(
                    m.error_log, $1, m.attempts + 1, 'reaped',
                    'no outcome before the lease expired; the message may have been sent',
                    'transient', $3, $4
                ),
                updated_at = $1
            FROM stuck
            WHERE %1$s AND m.id = stuck.id
            RETURNING m.id
        )

        SELECT count(*) FROM reaped
        $q$, v_scope) INTO v_got USING v_now, p_older_than, v_max, v_log_max;
        v_count := v_count + v_got;
    END LOOP;
    PERFORM mailroom_internal._count_outbound('reaped', v_count);
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom.reap_stuck_messages(interval) IS
'Return processing rows whose lease expired (or claimed longer ago than p_older_than) to queued, or failed; flags possibly_sent; on Citus lane by lane (SKIP LOCKED in one shard at a time). Errors: MR333 negative interval.';

GRANT EXECUTE ON FUNCTION mailroom.reap_stuck_messages(interval) TO mailroom_sender, mailroom_admin;

COMMENT ON FUNCTION mailroom_internal._classify_outcome(text, integer, text) IS
'Internal: sent, transient or permanent, by RFC 3463 enhanced code first, then RFC 5321 reply code.';

COMMENT ON FUNCTION mailroom_internal._log_line(timestamptz, integer, text, text) IS
'Internal: one error_log line (UTC time, attempt, outcome, reply text); redacted by trigger.';

COMMENT ON FUNCTION mailroom_internal._gives_up(text, integer, integer) IS
'Internal: whether this attempt fails the message for good (a transient outcome at attempt number outbound.max_attempts, default 11: the first and 10 retries).';

COMMENT ON FUNCTION mailroom_internal._attempt_log(text, timestamptz, integer, text, text, text, integer, integer) IS
'Internal: error_log after one attempt (its line, the give-up line when _gives_up), trimmed to the last p_max_chars.';

COMMENT ON FUNCTION mailroom_internal._reply_class(text, integer) IS
'Internal: the reply class of an outcome (2xx, 4xx, 5xx, dropped, timeout, connect, uncertain, local, other), the sender''s metric label.';
