-- Operator API: the queue's numbers (CLI and metrics), list/show without addresses or bodies,
-- and batched purge of old sent ones. The verbs that change queued mail (hold, release, cancel,
-- delete, run now, retry) are sql/37_outbound_queue.sql.

-- The queue's numbers. due_now counts what a claim would take now: queued, due, and not held back
-- by a domain limit or backoff (those are held_back); scheduled are first attempts whose send_after
-- is to come, retries_waiting the deferred ones (an attempt failed, the next is to come).
-- PL/pgSQL: the new statuses of migration 0160 may only be named in bodies checked when they run.
CREATE OR REPLACE FUNCTION mailroom.outbound_stats()
RETURNS TABLE (
    queued bigint,
    processing bigint,
    sent bigint,
    failed bigint,
    due_now bigint,
    retries_waiting bigint,
    possibly_sent bigint,
    oldest_queued_age_seconds double precision,
    stale_outcomes bigint,
    reaped bigint,
    held bigint,
    cancelled bigint,
    held_back bigint,
    scheduled bigint,
    webhook_possible_duplicates bigint
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_blocked text [] := ARRAY(SELECT b.domain FROM mailroom_internal._blocked_domains(v_now) AS b);
BEGIN
    RETURN QUERY
    SELECT
        count(*) FILTER (WHERE m.status = 'queued'),
        count(*) FILTER (WHERE m.status = 'processing'),
        count(*) FILTER (WHERE m.status = 'sent'),
        count(*) FILTER (WHERE m.status = 'failed'),
        count(*) FILTER (
            WHERE m.status = 'queued' AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= v_now
            AND m.rcpt_domain <> ALL (v_blocked)
        ),
        count(*) FILTER (WHERE m.status = 'queued' AND m.attempts > 0 AND m.next_retry_at > v_now),
        count(*) FILTER (WHERE m.possibly_sent),
        coalesce(
            extract(
                EPOCH FROM v_now - min(coalesce(m.send_after, m.created_at)) FILTER (
                    WHERE m.status = 'queued' AND coalesce(m.send_after, m.created_at) <= v_now
                )
            ),
            0
        )::double precision,
        (SELECT k.value FROM mailroom.outbound_counters AS k WHERE k.name = 'stale_outcomes'),
        (SELECT k.value FROM mailroom.outbound_counters AS k WHERE k.name = 'reaped'),
        count(*) FILTER (WHERE m.status = 'held'),
        count(*) FILTER (WHERE m.status = 'cancelled'),
        count(*) FILTER (
            WHERE m.status = 'queued' AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= v_now
            AND m.rcpt_domain = ANY (v_blocked)
        ),
        count(*) FILTER (WHERE m.status = 'queued' AND m.attempts = 0 AND m.next_retry_at > v_now),
        -- webhooks (sql/38_outbound_webhooks.sql): delivered again after a lost answer, possibly twice
        (SELECT k.value FROM mailroom.outbound_counters AS k WHERE k.name = 'webhook_possible_duplicates')
    FROM mailroom.outbound_messages AS m
    -- made by now: every row for a live reader (a clock pinned before them leaves them out)
    WHERE m.created_at <= v_now;
END;
$$;

COMMENT ON FUNCTION mailroom.outbound_stats() IS
'One row: counts per status (queued, processing, sent, failed, held, cancelled), due now (held back by domain limits excluded), retries waiting, scheduled, held back by limits, possibly sent, oldest queued age, stale outcomes, reaped, webhook deliveries possibly made twice (docs/webhooks.md).';

GRANT EXECUTE ON FUNCTION mailroom.outbound_stats() TO mailroom_monitor, mailroom_sender;
GRANT EXECUTE ON FUNCTION mailroom.clock() TO mailroom_monitor, mailroom_sender;

-- The same row as a view (dashboards that SELECT from it); the function holds the logic.
CREATE OR REPLACE VIEW mailroom.outbound_stats AS
SELECT
    s.queued,
    s.processing,
    s.sent,
    s.failed,
    s.due_now,
    s.retries_waiting,
    s.possibly_sent,
    s.oldest_queued_age_seconds,
    s.stale_outcomes,
    s.reaped,
    s.held,
    s.cancelled,
    s.held_back,
    s.scheduled,
    s.webhook_possible_duplicates
FROM mailroom.outbound_stats() AS s;

COMMENT ON VIEW mailroom.outbound_stats IS
'The row of mailroom.outbound_stats(): counts per status, due now, retries waiting, possibly sent, oldest queued age, stale outcomes, reaped, held, cancelled, held back by limits, scheduled, webhook deliveries possibly made twice.';

GRANT SELECT ON mailroom.outbound_stats TO mailroom_monitor, mailroom_sender;

CREATE OR REPLACE FUNCTION mailroom_internal._check_outbound_status(p_status text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_status IS NOT NULL AND p_status NOT IN ('queued', 'held', 'processing', 'sent', 'failed', 'cancelled') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR343',
            MESSAGE = format(
                'status must be queued, held, processing, sent, failed or cancelled, got %s',
                quote_literal(left(p_status, 40))
            );
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION mailroom.list_outbound_messages(
    p_status text DEFAULT null, p_limit integer DEFAULT 50, p_domain text DEFAULT null
)
RETURNS TABLE (
    id bigint,
    sender text,
    status mailroom.outbound_status,
    priority smallint,
    attempts integer,
    recipients integer,
    last_smtp_code integer,
    last_enhanced_code text,
    possibly_sent boolean,
    next_retry_at timestamptz,
    created_at timestamptz,
    sent_at timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM mailroom_internal._check_outbound_status(p_status);
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR343',
            MESSAGE = format('list limit must be between 1 and 10000, got %s', coalesce(p_limit::text, 'NULL'));
    END IF;
    RETURN QUERY
    SELECT
        m.id,
        coalesce(s.name, 'webhook ' || m.webhook_endpoint_id),
        m.status,
        m.priority,
        m.attempts,
        cardinality(m.to_addrs) + cardinality(m.cc_addrs) + cardinality(m.bcc_addrs),
        m.last_smtp_code,
        m.last_enhanced_code,
        m.possibly_sent,
        m.next_retry_at,
        m.created_at,
        m.sent_at
    FROM mailroom.outbound_messages AS m
    -- a webhook delivery (sql/38_outbound_webhooks.sql) has no sender: named by its endpoint
    LEFT JOIN mailroom.senders AS s ON m.sender_id = s.id
    WHERE
        (p_status IS NULL OR m.status = p_status::mailroom.outbound_status)
        AND (p_domain IS NULL OR m.rcpt_domain = mailroom_internal._normalize_domain(p_domain))
    ORDER BY m.id DESC
    LIMIT p_limit;
END;
$$;

COMMENT ON FUNCTION mailroom.list_outbound_messages(text, integer, text) IS
'Newest messages (optionally of one status, of one recipient domain) without addresses, subjects or bodies. Errors: MR343 unknown status or bad limit.';

GRANT EXECUTE ON FUNCTION mailroom.list_outbound_messages(text, integer, text) TO mailroom_monitor;

CREATE OR REPLACE FUNCTION mailroom.show_outbound_message(p_id bigint)
RETURNS TABLE (
    id bigint,
    sender text,
    status mailroom.outbound_status,
    priority smallint,
    attempts integer,
    recipients integer,
    recipient_domain text,
    message_id text,
    idempotency_key text,
    idempotency_scope text,
    last_outcome text,
    last_smtp_code integer,
    last_enhanced_code text,
    possibly_sent boolean,
    claimed_by text,
    lease_expires_at timestamptz,
    next_retry_at timestamptz,
    send_after timestamptz,
    created_at timestamptz,
    sent_at timestamptz,
    suppressed_recipients text[],
    error_log text
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT
        m.id,
        coalesce(s.name, 'webhook ' || m.webhook_endpoint_id),
        m.status,
        m.priority,
        m.attempts,
        cardinality(m.to_addrs) + cardinality(m.cc_addrs) + cardinality(m.bcc_addrs),
        m.rcpt_domain,
        m.message_id,
        m.idempotency_key,
        m.idempotency_scope,
        m.last_outcome,
        m.last_smtp_code,
        m.last_enhanced_code,
        m.possibly_sent,
        m.claimed_by,
        m.lease_expires_at,
        m.next_retry_at,
        m.send_after,
        m.created_at,
        m.sent_at,
        m.suppressed_recipients,
        m.error_log
    FROM mailroom.outbound_messages AS m
    -- a webhook delivery (sql/38_outbound_webhooks.sql) has no sender: named by its endpoint
    LEFT JOIN mailroom.senders AS s ON m.sender_id = s.id
    WHERE m.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR340',
            MESSAGE = format('no outbound message with id %s', coalesce(p_id::text, 'NULL'));
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom.show_outbound_message(bigint) IS
'One message for operators: state, priority, recipient domain, codes, positions of recipients dropped as suppressed and the (already scrubbed) error_log; no addresses or bodies. Errors: MR340 unknown id.';

GRANT EXECUTE ON FUNCTION mailroom.show_outbound_message(bigint) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.purge_sent_messages(
    p_before timestamptz, p_batch integer DEFAULT 5000, p_dry_run boolean DEFAULT false
)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer;
BEGIN
    IF p_before IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR342',
            MESSAGE = 'purge needs a cut-off time';
    END IF;
    IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR342',
            MESSAGE = format('purge batch must be between 1 and 100000, got %s', coalesce(p_batch::text, 'NULL'));
    END IF;
    IF p_dry_run THEN
        -- how many a purge would delete in all (not one batch), deleting nothing
        SELECT count(*) INTO v_count
        FROM mailroom.outbound_messages AS o
        WHERE o.status = 'sent' AND o.sent_at < p_before;
        RETURN v_count;
    END IF;
    DELETE FROM mailroom.outbound_messages AS m
    WHERE m.id IN (
        SELECT o.id
        FROM mailroom.outbound_messages AS o
        WHERE o.status = 'sent' AND o.sent_at < p_before
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    );
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom.purge_sent_messages(timestamptz, integer, boolean) IS
'Delete up to p_batch sent messages sent before p_before; call until it returns less than p_batch. p_dry_run: how many there are in all, deleting nothing. Errors: MR342 no cut-off or bad batch.';

GRANT EXECUTE ON FUNCTION mailroom.purge_sent_messages(timestamptz, integer, boolean) TO mailroom_admin;

COMMENT ON FUNCTION mailroom_internal._check_outbound_status(text) IS
'Internal: raise MR343 unless the status filter is NULL or an outbound status.';
