-- Operator API: the stats view (CLI and metrics), list/show without addresses or bodies,
-- retry of failed messages and batched purge of old sent ones.

CREATE OR REPLACE VIEW mailroom.outbound_stats AS
SELECT
    count(*) FILTER (WHERE m.status = 'queued') AS queued,
    count(*) FILTER (WHERE m.status = 'processing') AS processing,
    count(*) FILTER (WHERE m.status = 'sent') AS sent,
    count(*) FILTER (WHERE m.status = 'failed') AS failed,
    count(*) FILTER (
        WHERE m.status = 'queued'
        AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= mailroom.clock()
    ) AS due_now,
    count(*) FILTER (
        WHERE m.status = 'queued' AND m.attempts > 0 AND m.next_retry_at > mailroom.clock()
    ) AS retries_waiting,
    count(*) FILTER (WHERE m.possibly_sent) AS possibly_sent,
    coalesce(
        extract(
            EPOCH FROM mailroom.clock() - min(coalesce(m.send_after, m.created_at)) FILTER (
                WHERE m.status = 'queued'
                AND coalesce(m.send_after, m.created_at) <= mailroom.clock()
            )
        ),
        0
    )::double precision AS oldest_queued_age_seconds,
    (
        SELECT k.value FROM mailroom.outbound_counters AS k
        WHERE k.name = 'stale_outcomes'
    ) AS stale_outcomes,
    (
        SELECT k.value FROM mailroom.outbound_counters AS k
        WHERE k.name = 'reaped'
    ) AS reaped
FROM mailroom.outbound_messages AS m;

COMMENT ON VIEW mailroom.outbound_stats IS
'One row: counts per status, due now, retries waiting, possibly sent, oldest queued age, stale outcomes, reaped.';

GRANT SELECT ON mailroom.outbound_stats TO mailroom_monitor, mailroom_sender;
-- A view reads its tables with its owner's rights but calls functions with its reader's: the
-- readers of outbound_stats need mailroom.clock() (granted to them in sql/00_clock.sql too).

-- The same row as a function: what the driver calls (mailroom.db.contract names functions only).
-- Its columns are spelled out, not the view's row type, so a migration may still replace the view.
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
    reaped bigint
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.* FROM mailroom.outbound_stats AS s
$$;

COMMENT ON FUNCTION mailroom.outbound_stats() IS
'The row of the view mailroom.outbound_stats: counts per status, due now, retries waiting, possibly sent, oldest queued age, stale outcomes, reaped.';

GRANT EXECUTE ON FUNCTION mailroom.outbound_stats() TO mailroom_monitor, mailroom_sender;
GRANT EXECUTE ON FUNCTION mailroom.clock() TO mailroom_monitor, mailroom_sender;

CREATE OR REPLACE FUNCTION mailroom._check_outbound_status(p_status text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_status IS NOT NULL AND p_status NOT IN ('queued', 'processing', 'sent', 'failed') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR343',
            MESSAGE = format(
                'status must be queued, processing, sent or failed, got %s', quote_literal(left(p_status, 40))
            );
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION mailroom.list_outbound_messages(
    p_status text DEFAULT null, p_limit integer DEFAULT 50
)
RETURNS TABLE (
    id bigint,
    sender text,
    status mailroom.outbound_status,
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
    PERFORM mailroom._check_outbound_status(p_status);
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR343',
            MESSAGE = format('list limit must be between 1 and 10000, got %s', coalesce(p_limit::text, 'NULL'));
    END IF;
    RETURN QUERY
    SELECT
        m.id,
        s.name,
        m.status,
        m.attempts,
        cardinality(m.to_addrs) + cardinality(m.cc_addrs) + cardinality(m.bcc_addrs),
        m.last_smtp_code,
        m.last_enhanced_code,
        m.possibly_sent,
        m.next_retry_at,
        m.created_at,
        m.sent_at
    FROM mailroom.outbound_messages AS m
    INNER JOIN mailroom.senders AS s ON m.sender_id = s.id
    WHERE p_status IS NULL OR m.status = p_status::mailroom.outbound_status
    ORDER BY m.id DESC
    LIMIT p_limit;
END;
$$;

COMMENT ON FUNCTION mailroom.list_outbound_messages(text, integer) IS
'Newest messages (optionally of one status) without addresses, subjects or bodies. Errors: MR343 unknown status or bad limit.';

GRANT EXECUTE ON FUNCTION mailroom.list_outbound_messages(text, integer) TO mailroom_monitor;

CREATE OR REPLACE FUNCTION mailroom.show_outbound_message(p_id bigint)
RETURNS TABLE (
    id bigint,
    sender text,
    status mailroom.outbound_status,
    attempts integer,
    recipients integer,
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
        s.name,
        m.status,
        m.attempts,
        cardinality(m.to_addrs) + cardinality(m.cc_addrs) + cardinality(m.bcc_addrs),
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
    INNER JOIN mailroom.senders AS s ON m.sender_id = s.id
    WHERE m.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR340',
            MESSAGE = format('no outbound message with id %s', coalesce(p_id::text, 'NULL'));
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom.show_outbound_message(bigint) IS
'One message for operators: state, codes, positions of recipients dropped as suppressed and the (already scrubbed) error_log; no addresses or bodies. Errors: MR340 unknown id.';

GRANT EXECUTE ON FUNCTION mailroom.show_outbound_message(bigint) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom._requeue_failed(p_id bigint DEFAULT null)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer;
BEGIN
    UPDATE mailroom.outbound_messages AS m
    SET
        status = 'queued',
        attempts = 0,
        next_retry_at = NULL,
        claim_token = NULL,
        error_log = concat_ws(
            E'\n', m.error_log,
            to_char(mailroom.clock() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            || ' retried by operator'
        ),
        updated_at = mailroom.clock()
    WHERE m.status = 'failed' AND (p_id IS NULL OR m.id = p_id);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom._requeue_failed(bigint) IS
'Internal: failed message p_id (all failed ones when NULL) back to queued with a fresh attempt budget.';

CREATE OR REPLACE FUNCTION mailroom.retry_message(p_id bigint)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_status mailroom.outbound_status;
BEGIN
    SELECT m.status INTO v_status
    FROM mailroom.outbound_messages AS m
    WHERE m.id = p_id
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR340',
            MESSAGE = format('no outbound message with id %s', coalesce(p_id::text, 'NULL'));
    END IF;
    IF v_status <> 'failed' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR341',
            MESSAGE = format('message %s is %s; only failed messages can be retried', p_id, v_status);
    END IF;
    PERFORM mailroom._requeue_failed(p_id);
    RETURN p_id;
END;
$$;

COMMENT ON FUNCTION mailroom.retry_message(bigint) IS
'Put one failed message back in the queue with a fresh attempt budget. Errors: MR340 unknown id, MR341 not failed.';

GRANT EXECUTE ON FUNCTION mailroom.retry_message(bigint) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.retry_failed_messages()
RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailroom._requeue_failed();
$$;

COMMENT ON FUNCTION mailroom.retry_failed_messages() IS
'Put every failed message back in the queue with a fresh attempt budget; returns how many.';

GRANT EXECUTE ON FUNCTION mailroom.retry_failed_messages() TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.purge_sent_messages(
    p_before timestamptz, p_batch integer DEFAULT 5000
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

COMMENT ON FUNCTION mailroom.purge_sent_messages(timestamptz, integer) IS
'Delete up to p_batch sent messages sent before p_before; call until it returns 0. Errors: MR342 no cut-off or bad batch.';

GRANT EXECUTE ON FUNCTION mailroom.purge_sent_messages(timestamptz, integer) TO mailroom_admin;

COMMENT ON FUNCTION mailroom._check_outbound_status(text) IS
'Internal: raise MR343 unless the status filter is NULL or an outbound status.';
