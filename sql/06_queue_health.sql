-- Queue health: how far behind each queue is, and which workers are alive, hear NOTIFY and claim.
-- Every due-count reads only its queue's partial index (outbound_messages_due_idx,
-- tokens_pending_idx, mailboxes_expiry_idx; expired leases outbound_messages_processing_idx): the
-- statement runs with EXECUTE and the clock as a value, so the planner can match the index
-- predicates, and a health check costs the backlog, not the table. Workers report in with
-- worker_heartbeat every few seconds (never per row); operators read queue_health and worker_health.

CREATE OR REPLACE FUNCTION mailroom_internal._queue_health_statement()
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
    WHERE m.status = 'queued' AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= $1 AND m.created_at <= $1
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
    AND t.created_at <= $1
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

COMMENT ON FUNCTION mailroom_internal._queue_health_statement() IS
'Internal: text of the queue_health statement ($1 now), run with EXECUTE so the partial indexes match; tests EXPLAIN it.';

CREATE OR REPLACE FUNCTION mailroom_internal._explain_queue_health()
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXPLAIN without ANALYZE: plans the exact statement, reads nothing.
    RETURN QUERY EXECUTE 'EXPLAIN ' || mailroom_internal._queue_health_statement() USING mailroom.clock();
END;
$$;

COMMENT ON FUNCTION mailroom_internal._explain_queue_health() IS
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
    RETURN QUERY EXECUTE mailroom_internal._queue_health_statement() USING mailroom.clock();
END;
$$;

COMMENT ON FUNCTION mailroom.queue_health() IS
'One row per queue (outbound, tokens, inbox_expiry): rows due now, seconds since the oldest became due, expired leases (outbound; NULL elsewhere).';
GRANT EXECUTE ON FUNCTION mailroom.queue_health() TO mailroom_monitor, mailroom_admin, mailroom_sender;

CREATE OR REPLACE FUNCTION mailroom.worker_heartbeat(
    p_worker text,
    p_kind text,
    p_listening boolean,
    p_claimed integer DEFAULT 0,
    p_metrics_address text DEFAULT null,
    p_serves text DEFAULT null
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
    IF p_kind IS NULL OR NOT EXISTS (SELECT 1 FROM mailroom.worker_kinds AS k WHERE k.kind = p_kind) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('worker_heartbeat: kind must be one of %s, got %s',
                (SELECT string_agg(k.kind, ', ' ORDER BY k.kind) FROM mailroom.worker_kinds AS k),
                coalesce(quote_literal(left(p_kind, 40)), 'NULL'));
    END IF;
    IF p_listening IS NULL OR p_claimed IS NULL OR p_claimed < 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'worker_heartbeat: listening must be given and claimed must be zero or more';
    END IF;
    IF length(p_metrics_address) > 200 OR length(p_serves) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'worker_heartbeat: the metrics address and what it serves are at most 200 characters';
    END IF;
    INSERT INTO mailroom.workers AS w (
        worker, kind, host, started_at, last_seen_at, last_claim_at, listening, last_listening_at, claimed,
        metrics_address, serves
    ) VALUES (
        p_worker, p_kind, regexp_replace(p_worker, ':[^:]*$', ''), v_now, v_now,
        CASE WHEN p_claimed > 0 THEN v_now END, p_listening, CASE WHEN p_listening THEN v_now END, p_claimed,
        p_metrics_address, p_serves
    )
    ON CONFLICT (worker) DO UPDATE SET
        kind = excluded.kind,
        -- a name reused by a new process (host:pid) after the last one stopped starts afresh
        started_at = CASE WHEN w.stopped_at IS NULL THEN w.started_at ELSE excluded.started_at END,
        claimed = CASE WHEN w.stopped_at IS NULL THEN w.claimed ELSE 0 END + excluded.claimed,
        last_seen_at = v_now,
        last_claim_at = coalesce(excluded.last_claim_at, w.last_claim_at),
        listening = excluded.listening,
        last_listening_at = coalesce(excluded.last_listening_at, w.last_listening_at),
        metrics_address = excluded.metrics_address,
        serves = excluded.serves,
        stopped_at = NULL;
    PERFORM mailroom_internal._forget_workers(v_now);
END;
$$;

COMMENT ON FUNCTION mailroom.worker_heartbeat(text, text, boolean, integer, text, text) IS
'A worker (a kind of mailroom.worker_kinds) reports it is alive, whether its listener hears NOTIFY, how many rows it claimed since its last heartbeat, where its metrics are and what it serves.';
GRANT EXECUTE ON FUNCTION mailroom.worker_heartbeat(text, text, boolean, integer, text, text)
TO mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_http, mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom_internal._forget_workers(p_now timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Forget workers silent for long, and those that stopped cleanly a while ago (a few rows at
    -- most; skip any another heartbeat holds).
    DELETE FROM mailroom.workers AS w
    WHERE w.worker IN (
        SELECT o.worker
        FROM mailroom.workers AS o
        WHERE
            o.last_seen_at < p_now - mailroom.setting('workers.forget_after')::interval
            OR o.stopped_at < p_now - mailroom.setting('workers.forget_stopped_after')::interval
        FOR UPDATE SKIP LOCKED
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._forget_workers(timestamptz) IS
'Internal: remove workers silent for longer than workers.forget_after and those stopped longer ago than workers.forget_stopped_after.';

CREATE OR REPLACE FUNCTION mailroom.worker_stopped(p_worker text, p_claimed integer DEFAULT 0)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
BEGIN
    -- A clean exit: the last rows claimed, then stopped (it is no longer listed as running or lost).
    IF p_claimed IS NULL OR p_claimed < 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'worker_stopped: claimed must be zero or more';
    END IF;
    UPDATE mailroom.workers AS w
    SET
        stopped_at = v_now,
        last_seen_at = v_now,
        listening = false,
        claimed = w.claimed + p_claimed,
        last_claim_at = CASE WHEN p_claimed > 0 THEN v_now ELSE w.last_claim_at END
    WHERE w.worker = p_worker;
    RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION mailroom.worker_stopped(text, integer) IS
'A worker says it stopped cleanly (with the rows claimed since its last heartbeat); false when it never reported in.';
GRANT EXECUTE ON FUNCTION mailroom.worker_stopped(text, integer)
TO mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_http, mailroom_admin;

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
    started_at timestamptz,
    state text,
    stopped_at timestamptz,
    metrics_address text,
    serves text
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_lost_after interval := mailroom.setting('workers.lost_after')::interval;
BEGIN
    -- state: stopped (it said so), lost (no heartbeat for workers.lost_after: killed, hung or cut
    -- off), running. Running workers first, then lost, then stopped.
    RETURN QUERY
    SELECT
        w.worker,
        w.kind,
        w.host,
        w.listening AND w.stopped_at IS NULL,
        extract(EPOCH FROM v_now - w.last_seen_at)::double precision,
        extract(EPOCH FROM v_now - w.last_listening_at)::double precision,
        extract(EPOCH FROM v_now - w.last_claim_at)::double precision,
        w.claimed,
        w.started_at,
        s.state,
        w.stopped_at,
        w.metrics_address,
        w.serves
    FROM mailroom.workers AS w
    CROSS JOIN LATERAL (
        SELECT CASE
            WHEN w.stopped_at IS NOT NULL THEN 'stopped'
            WHEN w.last_seen_at < v_now - v_lost_after THEN 'lost'
            ELSE 'running'
        END AS state
    ) AS s
    ORDER BY array_position(ARRAY['running', 'lost', 'stopped'], s.state), w.kind, w.worker;
END;
$$;

COMMENT ON FUNCTION mailroom.worker_health() IS
'One row per worker: state (running, lost after workers.lost_after without a heartbeat, stopped), listening now, seconds since its last heartbeat, since its listener last heard, since its last claim; rows claimed; metrics address; what it serves.';
GRANT EXECUTE ON FUNCTION mailroom.worker_health() TO mailroom_monitor, mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.list_worker_kinds()
RETURNS TABLE (kind text, command text, description text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT k.kind, k.command, k.description FROM mailroom.worker_kinds AS k ORDER BY k.kind
$$;

COMMENT ON FUNCTION mailroom.list_worker_kinds() IS
'The kinds of worker (mailroom.worker_kinds): the command that runs each and what it does.';
GRANT EXECUTE ON FUNCTION mailroom.list_worker_kinds() TO mailroom_monitor, mailroom_admin;
