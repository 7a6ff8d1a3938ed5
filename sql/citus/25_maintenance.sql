-- Partition maintenance on Citus: the rows past retention of a partition that cannot be dropped.
--
-- sql/05's batch (SELECT … LIMIT n FOR UPDATE SKIP LOCKED, then DELETE by ctid) is a multi-shard
-- locking statement on a distributed partition, which Citus refuses, and a ctid names a row only
-- within one shard. Here: outbound rows lane by lane (one shard each, SKIP LOCKED kept, as the
-- claim, sql/citus/20); inbox messages by mailbox (the distribution key): up to a batch of the
-- partition's mailboxes, the inactive ones of which lose their old messages in one DELETE
-- (messages of an inactive mailbox are not locked by anyone else; the batch bounds the
-- mailboxes, not the rows; an active mailbox among them, extended past every TTL, waits). tokens stay on the
-- coordinator (sql/citus/10) and keep sql/05's statement (_delete_tokens_past_retention, sql/citus/12). Creating and dropping partitions is
-- sql/05's own: Citus distributes a new partition of a distributed table and drops its shards.

-- sql/05's seams of _delete_past_retention: outbound rows, lane by lane
CREATE OR REPLACE FUNCTION mailroom_internal._delete_outbound_past_retention(
    p_partition text, p_cutoff timestamptz, p_batch integer
)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count bigint := 0;
    v_lane integer;
    v_gone bigint[];
BEGIN
    FOR v_lane IN SELECT l.lane FROM mailroom.outbound_lanes AS l ORDER BY random() LOOP
        EXIT WHEN v_count >= p_batch;
        -- the lane written into the text, as in _claim_lane: a single-shard statement
        EXECUTE format(
            'WITH gone AS (DELETE FROM mailroom.%1$I AS m WHERE m.lane = %2$s AND (m.id, m.created_at) IN ('
            'SELECT d.id, d.created_at FROM mailroom.%1$I AS d WHERE d.lane = %2$s AND d.created_at < $1 '
            'AND d.status IN (''sent'', ''failed'', ''cancelled'') LIMIT $2 FOR UPDATE SKIP LOCKED) '
            'RETURNING m.id) SELECT array_agg(gone.id) FROM gone',
            p_partition, v_lane
        ) INTO v_gone USING p_cutoff, p_batch - v_count;
        CONTINUE WHEN v_gone IS NULL;
        -- their idempotency keys (a coordinator table), in a statement of their own
        DELETE FROM mailroom.outbound_idempotency_keys AS k WHERE k.message_id = ANY(v_gone);
        v_count := v_count + cardinality(v_gone);
    END LOOP;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_outbound_past_retention(text, timestamptz, integer) IS
'Internal (Citus): delete one batch of sent, failed or cancelled messages past retention from one outbound_messages partition, lane by lane (SKIP LOCKED), and their idempotency keys.';

-- inbox messages: of a batch of inactive mailboxes
CREATE OR REPLACE FUNCTION mailroom_internal._delete_messages_past_retention(
    p_partition text, p_cutoff timestamptz, p_batch integer
)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count bigint;
    v_boxes bigint[];
BEGIN
    -- the mailboxes of the oldest rows here (the partition is past every plan's TTL and the
    -- grace, so nearly all are closed), of which the inactive ones are emptied
    EXECUTE format(
        'SELECT array_agg(x.mailbox_id) FROM (SELECT DISTINCT g.mailbox_id FROM mailroom.%1$I AS g '
        'WHERE g.received_at < $1 LIMIT $2) AS x',
        p_partition
    ) INTO v_boxes USING p_cutoff, p_batch;
    v_boxes := ARRAY(
        SELECT b.id FROM mailroom.mailboxes AS b WHERE b.id = ANY(v_boxes) AND NOT b.is_active
    );
    EXECUTE format(
        'DELETE FROM mailroom.%1$I AS g WHERE g.mailbox_id = ANY($2) AND g.received_at < $1',
        p_partition
    ) USING p_cutoff, v_boxes;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_messages_past_retention(text, timestamptz, integer) IS
'Internal (Citus): delete the messages past retention of a batch of inactive mailboxes from one messages partition.';

CREATE OR REPLACE FUNCTION mailroom_internal._orphan_idempotency_keys(p_before timestamptz, p_limit integer)
RETURNS bigint[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_page bigint[];
    v_after timestamptz := '-infinity';
    v_after_id bigint := 0;
    v_orphans bigint[] := '{}';
BEGIN
    -- keys live on the coordinator, messages on the workers: Citus joins neither way, so the
    -- keys are read page by page (oldest first) and each page's messages looked up by id (one
    -- multi-shard SELECT); at most ten pages a run, the rest waits for the next
    FOR v_i IN 1..10 LOOP
        v_page := ARRAY(
            SELECT k.message_id
            FROM mailroom.outbound_idempotency_keys AS k
            WHERE k.created_at < p_before AND (k.created_at, k.message_id) > (v_after, v_after_id)
            ORDER BY k.created_at, k.message_id
            LIMIT p_limit
        );
        EXIT WHEN cardinality(v_page) = 0;
        SELECT k.created_at, k.message_id INTO v_after, v_after_id
        FROM mailroom.outbound_idempotency_keys AS k
        WHERE k.message_id = v_page[cardinality(v_page)]
        ORDER BY k.created_at DESC
        LIMIT 1;
        v_orphans := v_orphans || ARRAY(
            SELECT u.id FROM unnest(v_page) AS u (id)
            EXCEPT
            SELECT m.id FROM mailroom.outbound_messages AS m WHERE m.id = ANY(v_page)
        );
        EXIT WHEN cardinality(v_orphans) >= p_limit OR cardinality(v_page) < p_limit;
    END LOOP;
    RETURN v_orphans[1:p_limit];
END;
$$;

COMMENT ON FUNCTION mailroom_internal._orphan_idempotency_keys(timestamptz, integer) IS
'Internal (Citus): up to p_limit message ids of idempotency keys older than p_before whose message no longer exists (keys read by page, messages looked up by id).';
