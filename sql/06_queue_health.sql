-- Queue health: how far behind each queue is, and which workers are alive, hear NOTIFY and claim.
-- Every due-count reads only its queue's partial index (outbound_messages_due_idx,
-- tokens_pending_idx, mailboxes_expiry_idx; expired leases outbound_messages_processing_idx): the
-- statement runs with EXECUTE and the clock as a value, so the planner can match the index
-- predicates, and a health check costs the backlog, not the table. Workers report in with
-- worker_heartbeat every few seconds (never per row); operators read queue_health and worker_health.

CREATE OR REPLACE FUNCTION mailroom._queue_health_statement()
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    -- $1 now. One row per queue: due rows, seconds since the oldest became due, expired leases.
    SELECT $q$
SELECT
    'outbound'::text AS queue,
    d.due,
    coalesce(extract(EPOCH FROM $1 - d.oldest), 0)::double precision AS oldest_due_age_seconds,
    (
        SELECT count(*)
        FROM mailroom.outbound_messages AS p
        WHERE p.status = 'processing' AND p.lease_expires_at < $1
    ) AS expired_leases
FROM (
    -- the claim's due predicate (sql/33_outbound_claim.sql)
    SELECT count(*) AS due, min(coalesce(m.next_retry_at, m.created_at)) AS oldest
    FROM mailroom.outbound_messages AS m
    WHERE m.status = 'queued' AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= $1
) AS d
UNION ALL
-- undispatched, open, unexpired tokens: what dequeue_tokens scans (sql/11_tokens.sql)
SELECT
    'tokens',
    count(*),
    coalesce(extract(EPOCH FROM $1 - min(t.created_at)), 0)::double precision,
    NULL::bigint
FROM mailroom.tokens AS t
WHERE t.dispatched_at IS NULL AND t.consumed_at IS NULL AND t.revoked_at IS NULL AND t.expires_at > $1
UNION ALL
-- active inboxes past their expiry: what expire_mailboxes takes (sql/23_expiry.sql)
SELECT
    'inbox_expiry',
    count(*),
    coalesce(extract(EPOCH FROM $1 - min(b.expires_at)), 0)::double precision,
    NULL::bigint
FROM mailroom.mailboxes AS b
WHERE b.is_active AND b.expires_at <= $1
$q$::text;
$fn$;

COMMENT ON FUNCTION mailroom._queue_health_statement() IS
'Internal: text of the queue_health statement ($1 now), run with EXECUTE so the partial indexes match; tests EXPLAIN it.';

CREATE OR REPLACE FUNCTION mailroom._explain_queue_health()
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXPLAIN without ANALYZE: plans the exact statement, reads nothing.
    RETURN QUERY EXECUTE 'EXPLAIN ' || mailroom._queue_health_statement() USING mailroom.clock();
END;
$$;

COMMENT ON FUNCTION mailroom._explain_queue_health() IS
'Internal: EXPLAIN of the exact queue_health statement (pgTAP checks every due-count uses its partial index).';

CREATE OR REPLACE FUNCTION mailroom.queue_health()
RETURNS TABLE (
    queue text,
    due bigint,
    oldest_due_age_seconds double precision,
    expired_leases bigint
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY EXECUTE mailroom._queue_health_statement() USING mailroom.clock();
END;
$$;

COMMENT ON FUNCTION mailroom.queue_health() IS
'One row per queue (outbound, tokens, inbox_expiry): rows due now, seconds since the oldest became due, expired leases (outbound; NULL elsewhere).';
GRANT EXECUTE ON FUNCTION mailroom.queue_health() TO mailroom_monitor, mailroom_admin, mailroom_sender;

CREATE OR REPLACE FUNCTION mailroom.worker_heartbeat(
    p_worker text,
    p_kind text,
    p_listening boolean,
    p_claimed integer DEFAULT 0
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
BEGIN
    IF p_worker IS NULL OR length(p_worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'worker_heartbeat: the worker name must be 1 to 200 characters';
    END IF;
    IF p_kind IS NULL OR p_kind NOT IN ('collector', 'sender', 'expiry') THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('worker_heartbeat: kind must be collector, sender or expiry, got %s',
                coalesce(quote_literal(left(p_kind, 40)), 'NULL'));
    END IF;
    IF p_listening IS NULL OR p_claimed IS NULL OR p_claimed < 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'worker_heartbeat: listening must be given and claimed must be zero or more';
    END IF;
    INSERT INTO mailroom.workers AS w (
        worker, kind, host, started_at, last_seen_at, last_claim_at, listening, last_listening_at, claimed
    ) VALUES (
        p_worker, p_kind, regexp_replace(p_worker, ':[^:]*$', ''), v_now, v_now,
        CASE WHEN p_claimed > 0 THEN v_now END, p_listening, CASE WHEN p_listening THEN v_now END, p_claimed
    )
    ON CONFLICT (worker) DO UPDATE SET
        kind = excluded.kind,
        last_seen_at = v_now,
        last_claim_at = coalesce(excluded.last_claim_at, w.last_claim_at),
        listening = excluded.listening,
        last_listening_at = coalesce(excluded.last_listening_at, w.last_listening_at),
        claimed = w.claimed + excluded.claimed;
    -- forget workers gone for long (a few rows at most; skip any another heartbeat holds)
    DELETE FROM mailroom.workers AS w
    WHERE w.worker IN (
        SELECT o.worker
        FROM mailroom.workers AS o
        WHERE o.last_seen_at < v_now - mailroom.setting('workers.forget_after')::interval
        FOR UPDATE SKIP LOCKED
    );
END;
$$;

COMMENT ON FUNCTION mailroom.worker_heartbeat(text, text, boolean, integer) IS
'A worker (collector, sender, expiry) reports it is alive, whether its listener hears NOTIFY, and how many rows it claimed since its last heartbeat.';
GRANT EXECUTE ON FUNCTION mailroom.worker_heartbeat(text, text, boolean, integer)
TO mailroom_collector, mailroom_sender, mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom.worker_health()
RETURNS TABLE (
    worker text,
    kind text,
    host text,
    listening boolean,
    heartbeat_age_seconds double precision,
    listener_age_seconds double precision,
    last_claim_age_seconds double precision,
    claimed bigint,
    started_at timestamptz
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT
        w.worker,
        w.kind,
        w.host,
        w.listening,
        extract(EPOCH FROM mailroom.clock() - w.last_seen_at)::double precision,
        extract(EPOCH FROM mailroom.clock() - w.last_listening_at)::double precision,
        extract(EPOCH FROM mailroom.clock() - w.last_claim_at)::double precision,
        w.claimed,
        w.started_at
    FROM mailroom.workers AS w
    ORDER BY w.kind, w.worker
$$;

COMMENT ON FUNCTION mailroom.worker_health() IS
'One row per worker: listening now, seconds since its last heartbeat, since its listener last heard, since its last claim; rows claimed.';
GRANT EXECUTE ON FUNCTION mailroom.worker_health() TO mailroom_monitor, mailroom_admin;
