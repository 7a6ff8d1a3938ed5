-- The outbound queue on Citus: work is taken one lane (one shard) at a time.
--
-- Citus runs SELECT … FOR UPDATE SKIP LOCKED only on one shard: a statement whose every
-- distributed table is filtered on one lane value. So the claim and the reaper of sql/33 and
-- sql/34 are replaced here by loops over the lanes (mailroom.outbound_lanes), starting at a random
-- lane so concurrent senders spread over the shards; in each lane the statement is the
-- single-node one with `lane = p_lane` added, and SKIP LOCKED keeps every row to one claimer.
-- The due predicate and the result columns are those of sql/33 (_outbound_due, _claim): a
-- change there is made here too (tests/citus run the senders on this path).
-- Per-domain caps (domain_limits) are not enforced per lane yet: a claim while a cap is set
-- fails with MR323 rather than exceed it; a domain's backoff is honoured (docs/scale.md).

CREATE OR REPLACE FUNCTION mailroom._claim_lane(
    p_lane integer, p_now timestamptz, p_limit integer, p_worker text, p_lease interval, p_blocked text[],
    p_claim_token bigint
)
RETURNS SETOF mailroom.outbound_messages
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    -- the lane is written into the text: Citus routes a statement to one shard by a constant
    -- (with a parameter in its place, the locking subquery has no distributed plan)
    RETURN QUERY EXECUTE format($sql$
    UPDATE mailroom.outbound_messages AS m
    SET
        status = 'processing',
        claimed_by = $3,
        claim_token = $6,
        claimed_at = $1,
        lease_expires_at = $1 + $4,
        updated_at = $1
    WHERE
        m.lane = %1$s
        AND (m.id, m.created_at) IN (
            SELECT d.id, d.created_at
            FROM mailroom.outbound_messages AS d
            WHERE
                d.lane = %1$s
                AND d.status = 'queued'
                AND coalesce(d.next_retry_at, '-infinity'::timestamptz) <= $1
                AND d.rcpt_domain <> ALL($5)
            ORDER BY d.priority DESC, coalesce(d.next_retry_at, '-infinity'::timestamptz), d.id
            LIMIT $2
            FOR UPDATE SKIP LOCKED
        )
    RETURNING m.*
    $sql$, p_lane)
    USING p_now, p_limit, p_worker, p_lease, p_blocked, p_claim_token;
END;
$fn$;

COMMENT ON FUNCTION mailroom._claim_lane(integer, timestamptz, integer, text, interval, text[], bigint) IS
'Citus only: claim up to p_limit due rows of one lane (one shard, SKIP LOCKED): processing under the lease, with the claim token of this claim (one nextval per lane: a volatile function cannot run per row of a distributed UPDATE).';

REVOKE ALL ON FUNCTION mailroom._claim_lane(integer, timestamptz, integer, text, interval, text[], bigint) FROM public;

CREATE OR REPLACE FUNCTION mailroom._claim(
    p_now timestamptz, p_limit integer, p_worker text, p_lease interval, p_limited boolean
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
    smtp_password_sealed bytea,
    smtp_password_set boolean,
    smtp_allow_cleartext boolean,
    return_path text,
    recipients text[],
    return_paths text[],
    list_unsubscribe text[],
    dkim_domain text,
    dkim_selector text,
    dkim_public_key text,
    dkim_algorithm text,
    attachments jsonb
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- claim_messages' planner settings (sql/33) make the reading statement's plan cost about 1e10 (a
-- disabled node), far above jit_above_cost: each claim then JIT-compiled it with inlining, 9-14 s
-- for a batch of 100 on the coordinator (auto_explain). The statement is a few index probes.
SET jit = off
AS $fn$
#variable_conflict use_column
DECLARE
    v_blocked text[] := '{}';
    v_lane integer;
    v_left integer := p_limit;
    v_got integer;
    v_rows mailroom.outbound_messages[];
BEGIN
    IF p_limited THEN
        IF EXISTS (
            SELECT 1 FROM mailroom.domain_limits AS l
            WHERE l.max_in_flight IS NOT NULL OR l.max_per_minute IS NOT NULL
        ) THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR323',
                MESSAGE = 'per-domain caps (domain_limits) are not supported on a Citus coordinator yet',
                HINT = 'Remove the caps (mailroom.set_domain_limit) or run on a single node; see docs/scale.md.';
        END IF;
        v_blocked := ARRAY(SELECT s.domain FROM mailroom.domain_state AS s WHERE s.backoff_until > p_now);
    END IF;
    FOR v_lane IN SELECT l.lane FROM mailroom.outbound_lanes AS l ORDER BY random() LOOP
        EXIT WHEN v_left <= 0;
        -- Claim first, into a variable, then read what goes with the rows in a statement of its
        -- own: one statement naming both _claim_lane and a reference table is shipped by Citus to
        -- a node as a whole (the claim then runs nested, in another backend), which cost ~0.5 s
        -- a lane even when nothing was due (docs/scale.md).
        v_rows := ARRAY(
            SELECT c
            FROM mailroom._claim_lane(
                v_lane, p_now, v_left, p_worker, p_lease, v_blocked, nextval('mailroom.outbound_claim_token_seq')
            ) AS c
        );
        CONTINUE WHEN cardinality(v_rows) = 0;
        RETURN QUERY
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
            r.smtp_password_sealed IS NOT NULL OR r.smtp_password_encrypted IS NOT NULL,
            r.smtp_allow_cleartext,
            CASE WHEN cardinality(e.envelope) = 1 THEN p.paths[1] END,
            e.envelope,
            p.paths,
            CASE WHEN c.bulk THEN mailroom._list_unsubscribe(c.id, c.sender_id, cardinality(e.envelope)) END,
            k.domain,
            k.selector,
            k.public_key,
            k.algorithm,
            mailroom._attachments_json(c.attachments)
        FROM unnest(v_rows) AS c
        INNER JOIN mailroom.senders AS r ON c.sender_id = r.id
        CROSS JOIN LATERAL (SELECT mailroom._envelope(c.to_addrs, c.cc_addrs, c.bcc_addrs) AS envelope) AS e
        CROSS JOIN LATERAL (SELECT mailroom._return_paths(c.id, c.sender_id, cardinality(e.envelope)) AS paths) AS p
        LEFT JOIN mailroom.dkim_keys AS k ON k.domain = mailroom._address_domain(r.from_address)
        LEFT JOIN LATERAL mailroom._claim_token_email(c.token_id) AS t ON TRUE
        ORDER BY c.id;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END LOOP;
END;
$fn$;

COMMENT ON FUNCTION mailroom._claim(timestamptz, integer, text, interval, boolean) IS
'Internal (Citus): the claim, lane by lane from a random one (_claim_lane: one shard, SKIP LOCKED), with the relay settings and rendered token emails of sql/33; MR323 while per-domain caps are set.';

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
    v_lane integer;
    v_got integer;
    v_count integer := 0;
BEGIN
    IF p_older_than < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR333',
            MESSAGE = format('reap interval must not be negative, got %s', p_older_than);
    END IF;
    FOR v_lane IN SELECT l.lane FROM mailroom.outbound_lanes AS l ORDER BY random() LOOP
        WITH stuck AS (
            SELECT m.id
            FROM mailroom.outbound_messages AS m
            WHERE
                m.lane = v_lane
                AND m.status = 'processing'
                AND (
                    m.lease_expires_at <= v_now
                    OR m.claimed_at <= v_now - p_older_than
                )
            FOR UPDATE SKIP LOCKED
        ),

        reaped AS (
            UPDATE mailroom.outbound_messages AS m
            SET
                attempts = m.attempts + 1,
                status = CASE
                    WHEN mailroom._gives_up('transient', m.attempts + 1, v_max) THEN 'failed' ELSE 'queued'
                END::mailroom.outbound_status,
                next_retry_at = CASE WHEN NOT mailroom._gives_up('transient', m.attempts + 1, v_max) THEN v_now END,
                possibly_sent = TRUE,
                claimed_by = NULL,
                lease_expires_at = NULL,
                error_log = mailroom._attempt_log(
                    m.error_log, v_now, m.attempts + 1, 'reaped',
                    'no outcome before the lease expired; the message may have been sent',
                    'transient', v_max, v_log_max
                ),
                updated_at = v_now
            FROM stuck
            WHERE m.lane = v_lane AND m.id = stuck.id
            RETURNING m.id
        )

        SELECT count(*) INTO v_got FROM reaped;
        v_count := v_count + v_got;
    END LOOP;
    IF v_count > 0 THEN
        UPDATE mailroom.outbound_counters AS k
        SET value = k.value + v_count
        WHERE k.name = 'reaped';
    END IF;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom.reap_stuck_messages(interval) IS
'Return processing rows whose lease expired (or claimed longer ago than p_older_than) to queued, or failed; flags possibly_sent; on Citus lane by lane (SKIP LOCKED in one shard at a time). Errors: MR333 negative interval.';

-- purge: the messages of a purged inbox go with it (on a single node by the foreign key's cascade)
CREATE OR REPLACE FUNCTION mailroom.purge_mailboxes(
    p_older_than interval,
    p_batch integer DEFAULT null
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('retention must be a non-negative interval, got %s',
                coalesce(p_older_than::text, 'NULL'));
    END IF;
    WITH doomed AS (
        SELECT m.id
        FROM mailroom.mailboxes AS m
        WHERE NOT m.is_active AND m.inactive_since <= mailroom.clock() - p_older_than
        ORDER BY m.inactive_since
        LIMIT mailroom._batch_size(p_batch, 'inbox.purge_batch')
        FOR UPDATE SKIP LOCKED
    ),

    gone AS (
        DELETE FROM mailroom.mailboxes AS m
        USING doomed
        WHERE m.id = doomed.id
        RETURNING m.id
    )

    SELECT coalesce(array_agg(gone.id), '{}') INTO v_ids FROM gone;
    DELETE FROM mailroom.messages AS g WHERE g.mailbox_id = ANY(v_ids);
    RETURN cardinality(v_ids);
END;
$$;

COMMENT ON FUNCTION mailroom.purge_mailboxes(interval, integer) IS
'Hard-delete up to p_batch (default inbox.purge_batch) mailboxes inactive for longer than p_older_than, and their messages (on Citus, where they live on the workers); returns how many.';

CREATE OR REPLACE FUNCTION mailroom._queue_verb_change(
    p_verb text,
    p_where text,
    p_positions text,
    p_set text,
    p_ids bigint[],
    p_domain text,
    p_from text[],
    p_include boolean,
    p_now timestamptz
)
RETURNS TABLE (changed bigint, ids bigint[], domains text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_lane integer;
    v_ids bigint[] := '{}';
    v_domains text[] := '{}';
    v_keys_scope text[] := '{}';
    v_keys_key text[] := '{}';
    v_got_ids bigint[];
    v_got_domains text[];
    v_got_scopes text[];
    v_got_keys text[];
BEGIN
    -- The operator verbs' change, lane by lane: SKIP LOCKED runs only in a single-shard
    -- statement (the lane written into the text, as in _claim_lane); a deleted message's
    -- idempotency key (a coordinator table) goes in a statement of its own. The selection's
    -- alias m becomes d inside (a word-start match: mailroom. stays).
    FOR v_lane IN SELECT l.lane FROM mailroom.outbound_lanes AS l ORDER BY l.lane LOOP
        IF p_verb = 'delete' THEN
            EXECUTE format(
                'WITH gone AS (DELETE FROM mailroom.outbound_messages AS m WHERE m.lane = %2$s '
                'AND (m.id, m.created_at) IN (SELECT d.id, d.created_at FROM mailroom.outbound_messages AS d '
                'WHERE d.lane = %2$s AND %1$s AND d.status = ANY ($3::mailroom.outbound_status[]) FOR UPDATE SKIP LOCKED) '
                'RETURNING m.id, m.rcpt_domain, m.idempotency_scope, m.idempotency_key) '
                'SELECT array_agg(g.id), array_agg(g.rcpt_domain), array_agg(g.idempotency_scope), '
                'array_agg(g.idempotency_key) FROM gone AS g',
                regexp_replace(p_where, '\mm\.', 'd.', 'g'), v_lane
            ) INTO v_got_ids, v_got_domains, v_got_scopes, v_got_keys
            USING p_ids, p_domain, p_from, p_include, p_now;
            v_keys_scope := v_keys_scope || coalesce(v_got_scopes, '{}');
            v_keys_key := v_keys_key || coalesce(v_got_keys, '{}');
        ELSE
            EXECUTE format(
                'WITH done AS (UPDATE mailroom.outbound_messages AS m SET %3$s, updated_at = $5 WHERE m.lane = %4$s '
                'AND (m.id, m.created_at) IN (SELECT d.id, d.created_at FROM mailroom.outbound_messages AS d '
                'WHERE d.lane = %4$s AND %1$s AND d.status = ANY ($3::mailroom.outbound_status[]) '
                'AND ($4 OR cardinality(%2$s) = 0) FOR UPDATE SKIP LOCKED) '
                'RETURNING m.id, m.rcpt_domain) '
                'SELECT array_agg(x.id), array_agg(x.rcpt_domain) FROM done AS x',
                regexp_replace(p_where, '\mm\.', 'd.', 'g'), regexp_replace(p_positions, '\mm\.', 'd.', 'g'), p_set, v_lane
            ) INTO v_got_ids, v_got_domains
            USING p_ids, p_domain, p_from, p_include, p_now;
        END IF;
        v_ids := v_ids || coalesce(v_got_ids, '{}');
        v_domains := v_domains || coalesce(v_got_domains, '{}');
    END LOOP;
    IF cardinality(v_keys_key) > 0 THEN
        DELETE FROM mailroom.outbound_idempotency_keys AS k
        USING unnest(v_keys_scope, v_keys_key) AS g (scope, key)
        WHERE k.scope = g.scope AND k.key = g.key AND k.message_id = ANY(v_ids);
    END IF;
    changed := cardinality(v_ids);
    ids := ARRAY(SELECT u.id FROM unnest(v_ids) AS u (id) ORDER BY u.id LIMIT 20);
    domains := ARRAY(SELECT DISTINCT u.d FROM unnest(v_domains) AS u (d) WHERE u.d IS NOT NULL);
    RETURN NEXT;
END;
$fn$;

COMMENT ON FUNCTION mailroom._queue_verb_change(text, text, text, text, bigint[], text, text[], boolean, timestamptz) IS
'Internal (Citus): _queue_verb''s change lane by lane (single-shard SKIP LOCKED); deleted messages'' idempotency keys in a statement of their own.';

-- retry's test of the suppression list runs in statements Citus pushes to the shards, where it
-- reads suppressions (a reference table: a replica on every node) from inside a function: a
-- "nested distributed execution", refused by default because a nested query may not see the
-- outer transaction's writes. Suppressions are never written by the statements that test them,
-- so the nested read is exact here; the permission is given to this function only.
-- (through EXECUTE: sqlfluff cannot parse a SET of a dotted setting in ALTER FUNCTION)
DO $nested$
BEGIN
    EXECUTE 'ALTER FUNCTION mailroom._suppressed_recipients(text[], text[], text[]) '
        'SET citus.allow_nested_distributed_execution = on';
END;
$nested$;
