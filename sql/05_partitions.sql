-- Time partitions of messages (received_at), outbound_messages (created_at) and tokens
-- (created_at): listing them, creating them ahead, dropping those wholly past retention
-- (migration 0100 made the tables partitioned; docs/retention.md describes the layout).

CREATE OR REPLACE FUNCTION mailroom_internal._partition_bound(p_width interval, p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Partition boundaries are multiples of the width from Monday 2000-01-03 00:00 UTC, the
    -- same rule migration 0100 used.
    SELECT pg_catalog.date_bin(p_width, p_at, '2000-01-03 00:00:00+00'::timestamptz)
$$;

COMMENT ON FUNCTION mailroom_internal._partition_bound(interval, timestamptz) IS
'Internal: the partition boundary at or before p_at for partitions p_width wide (aligned to 2000-01-03 UTC).';

CREATE OR REPLACE FUNCTION mailroom_internal._partitions(p_table text)
RETURNS TABLE (partition_name text, lower_bound timestamptz, upper_bound timestamptz, is_default boolean)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- The partitions of mailroom.<p_table> with their ranges (NULL bounds for the DEFAULT one),
    -- read from the catalog: FOR VALUES FROM ('…') TO ('…').
    SELECT
        c.relname::text,
        (regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
        (regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz,
        pg_catalog.pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'
    FROM pg_catalog.pg_inherits AS i
    JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = pg_catalog.to_regclass('mailroom.' || quote_ident(p_table))
    ORDER BY 2 NULLS LAST
$$;

COMMENT ON FUNCTION mailroom_internal._partitions(text) IS
'Internal: partitions of a partitioned mailroom table with their time range (NULL bounds: the DEFAULT partition).';

CREATE OR REPLACE FUNCTION mailroom_internal._name_partition_indexes(p_table text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_r record;
BEGIN
    -- An index of a partition is named <partition>_<the parent index's name without
    -- <table>_>: outbound_messages_p20300101t0000_due_idx for outbound_messages_due_idx, so a
    -- plan names the index it uses (PostgreSQL would name it after its columns).
    FOR v_r IN
        SELECT ci.relname AS child, c.relname || '_' || substr(pi.relname, length(p_table) + 2) AS wanted
        FROM pg_catalog.pg_inherits AS i
        JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
        JOIN pg_catalog.pg_index AS x ON x.indrelid = c.oid
        JOIN pg_catalog.pg_class AS ci ON ci.oid = x.indexrelid
        JOIN pg_catalog.pg_inherits AS ii ON ii.inhrelid = x.indexrelid
        JOIN pg_catalog.pg_class AS pi ON pi.oid = ii.inhparent
        WHERE i.inhparent = pg_catalog.to_regclass('mailroom.' || quote_ident(p_table))
            AND pi.relname LIKE p_table || '\_%'
            AND ci.relname <> c.relname || '_' || substr(pi.relname, length(p_table) + 2)
    LOOP
        EXECUTE format('ALTER INDEX mailroom.%I RENAME TO %I', v_r.child, v_r.wanted);
    END LOOP;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._name_partition_indexes(text) IS
'Internal: rename the indexes of the partitions of a table to <partition>_<parent index name without the table prefix>.';

CREATE OR REPLACE FUNCTION mailroom_internal._create_partition(
    p_table text, p_key text, p_lower timestamptz, p_upper timestamptz
)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_name text := p_table || '_p' || to_char(p_lower AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MI');
    v_default text := p_table || '_default';
    v_cols text;
    v_moved bigint := 0;
    v_has_rows boolean;
BEGIN
    -- The partition is built beside the table and then attached: ATTACH PARTITION takes SHARE
    -- UPDATE EXCLUSIVE on the parent, which readers and writers of the table do not conflict with
    -- (CREATE TABLE ... PARTITION OF takes ACCESS EXCLUSIVE on it). It still takes ACCESS
    -- EXCLUSIVE on the DEFAULT partition, which it checks for rows of the new range; rows of that
    -- range the DEFAULT partition holds are moved into the new partition first (returns how many).
    EXECUTE format(
        'SELECT EXISTS (SELECT 1 FROM mailroom.%I WHERE %I >= $1 AND %I < $2)', v_default, p_key, p_key
    ) INTO STRICT v_has_rows USING p_lower, p_upper;
    EXECUTE format(
        'CREATE TABLE mailroom.%I (LIKE mailroom.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', v_name, p_table
    );
    IF v_has_rows THEN
        SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO v_cols
        FROM pg_catalog.pg_attribute AS a
        WHERE a.attrelid = pg_catalog.to_regclass('mailroom.' || quote_ident(p_table))
            AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '';
        EXECUTE format(
            'WITH moved AS (DELETE FROM mailroom.%1$I WHERE %2$I >= $1 AND %2$I < $2 RETURNING %3$s) '
            'INSERT INTO mailroom.%4$I (%3$s) SELECT %3$s FROM moved',
            v_default, p_key, v_cols, v_name
        ) USING p_lower, p_upper;
        GET DIAGNOSTICS v_moved = ROW_COUNT;
    END IF;
    EXECUTE format(
        'ALTER TABLE mailroom.%I ATTACH PARTITION mailroom.%I FOR VALUES FROM (%L) TO (%L)',
        p_table, v_name, p_lower, p_upper
    );
    PERFORM mailroom_internal._name_partition_indexes(p_table);
    RETURN v_moved;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._create_partition(text, text, timestamptz, timestamptz) IS
'Internal: create the partition [p_lower, p_upper) of a mailroom table, moving rows of that range out of its DEFAULT partition; returns the rows moved.';

CREATE OR REPLACE FUNCTION mailroom_internal._maintain_partitions()
RETURNS TABLE (action text, table_name text, partition_name text, row_count bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_ahead interval := mailroom.setting('partitions.ahead')::interval;
    v_batch integer := mailroom.setting('partitions.delete_batch')::integer;
    v_t record;
    v_p record;
    v_cutoff timestamptz;
    v_width interval;
    v_lo timestamptz;
    v_hi timestamptz;
    v_live boolean;
    v_count bigint;
    v_drop text [] := '{}';
    v_drop_table text [] := '{}';
    v_drop_rows bigint [] := '{}';
    v_i integer;
BEGIN
    -- One caller at a time (any number of expiry workers, pg_cron): the others return 'skipped'.
    -- The lock is a row of mailroom.job_locks: no role outside mailroom can take it (an advisory
    -- key could be taken by any login and make every run skip).
    PERFORM 1 FROM mailroom.job_locks AS j WHERE j.name = 'maintain_partitions' FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'skipped'::text, null::text, null::text, 0::bigint;
        RETURN;
    END IF;
    -- DDL below waits at most this long for a lock; a busy partition is left for the next run
    PERFORM pg_catalog.set_config(
        'lock_timeout',
        (extract(EPOCH FROM mailroom.setting('partitions.lock_timeout')::interval) * 1000)::bigint::text,
        true
    );

    FOR v_t IN
        SELECT * FROM (VALUES
            ('outbound_messages', 'created_at', 'partitions.outbound.width'),
            ('messages', 'received_at', 'partitions.messages.width'),
            ('tokens', 'created_at', 'partitions.tokens.width')
        ) AS t (tbl, key, width_setting)
    LOOP
        v_cutoff := CASE v_t.tbl
            WHEN 'outbound_messages' THEN v_now - mailroom.setting('outbound.retention')::interval
            WHEN 'messages' THEN v_now
                - (SELECT coalesce(max(p.max_ttl_minutes), 0) FROM mailroom.plans AS p) * interval '1 minute'
                - mailroom.setting('inbox.retention_grace')::interval
            ELSE v_now - mailroom.setting('tokens.retention')::interval
        END;

        FOR v_p IN SELECT * FROM mailroom_internal._partitions(v_t.tbl) AS x LOOP
            IF v_p.is_default THEN
                EXECUTE format('SELECT count(*) FROM mailroom.%I', v_p.partition_name) INTO v_count;
                IF v_count > 0 THEN
                    RETURN QUERY SELECT 'default_rows'::text, v_t.tbl, v_p.partition_name, v_count;
                END IF;
            END IF;
            IF NOT v_p.is_default AND v_p.upper_bound > v_cutoff THEN
                CONTINUE;
            END IF;
            -- wholly past retention (or the DEFAULT partition): does it hold anything live?
            v_live := CASE v_t.tbl
                WHEN 'outbound_messages' THEN mailroom_internal._outbound_partition_live(v_p.partition_name, v_cutoff)
                WHEN 'messages' THEN mailroom_internal._messages_partition_live(v_p.partition_name, v_cutoff)
                ELSE mailroom_internal._tokens_partition_live(v_p.partition_name, v_cutoff)
            END;
            IF NOT v_live AND NOT v_p.is_default THEN
                EXECUTE format('SELECT count(*) FROM mailroom.%I', v_p.partition_name) INTO v_count;
                v_drop := v_drop || v_p.partition_name;
                v_drop_table := v_drop_table || v_t.tbl;
                v_drop_rows := v_drop_rows || v_count;
                CONTINUE;
            END IF;
            -- not droppable: its rows past retention go in batches, as purge_* do
            v_count := mailroom_internal._delete_past_retention(v_t.tbl, v_p.partition_name, v_cutoff, v_batch);
            IF v_count > 0 OR NOT v_p.is_default THEN
                RETURN QUERY SELECT
                    CASE WHEN v_p.is_default THEN 'deleted' ELSE 'kept_deleted' END,
                    v_t.tbl, v_p.partition_name, v_count;
            END IF;
        END LOOP;
    END LOOP;

    -- idempotency keys whose message is gone (purge_sent_messages) once past outbound retention
    WITH doomed AS (
        SELECT k.scope, k.key
        FROM mailroom.outbound_idempotency_keys AS k
        WHERE k.message_id = ANY(mailroom_internal._orphan_idempotency_keys(
            v_now - mailroom.setting('outbound.retention')::interval, v_batch
        ))
        FOR UPDATE SKIP LOCKED
    )

    DELETE FROM mailroom.outbound_idempotency_keys AS k
    USING doomed AS d
    WHERE k.scope = d.scope AND k.key = d.key;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        RETURN QUERY SELECT 'keys_deleted'::text, 'outbound_idempotency_keys'::text, null::text, v_count;
    END IF;

    -- delivery receipts (sql/21_delivery.sql) a day old: a lost answer is settled within seconds
    WITH doomed AS (
        SELECT r.key
        FROM mailroom.delivery_receipts AS r
        WHERE r.created_at < v_now - interval '1 day'
        LIMIT v_batch
        FOR UPDATE SKIP LOCKED
    )

    DELETE FROM mailroom.delivery_receipts AS r
    USING doomed AS d
    WHERE r.key = d.key;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        RETURN QUERY SELECT 'receipts_deleted'::text, 'delivery_receipts'::text, null::text, v_count;
    END IF;

    -- rate windows past the longest limit, audit lines past audit.retention (sql/09_rates.sql)
    RETURN QUERY SELECT x.action, x.table_name, null::text, x.row_count
    FROM mailroom_internal._prune_rates_and_audit(v_batch) AS x;

    -- DDL last, its locks held to commit: attaching a partition ahead takes SHARE UPDATE
    -- EXCLUSIVE on the parent and ACCESS EXCLUSIVE on its DEFAULT partition; dropping one takes
    -- ACCESS EXCLUSIVE on the parent (DETACH ... CONCURRENTLY is not allowed while a table has a
    -- DEFAULT partition, nor inside a function). docs/retention.md, "Locks".
    FOR v_t IN
        SELECT * FROM (VALUES
            ('outbound_messages', 'created_at', 'partitions.outbound.width'),
            ('messages', 'received_at', 'partitions.messages.width'),
            ('tokens', 'created_at', 'partitions.tokens.width')
        ) AS t (tbl, key, width_setting)
    LOOP
        v_width := mailroom.setting(v_t.width_setting)::interval;
        -- partitions ahead: from the end of the last one (or now's boundary, if that is later:
        -- a gap stays with the DEFAULT partition) until now + partitions.ahead is covered
        SELECT max(x.upper_bound) INTO v_lo FROM mailroom_internal._partitions(v_t.tbl) AS x;
        v_lo := greatest(v_lo, mailroom_internal._partition_bound(v_width, v_now));
        WHILE v_lo < v_now + v_ahead LOOP
            v_hi := mailroom_internal._partition_bound(v_width, v_lo) + v_width;
            BEGIN
                v_count := mailroom_internal._create_partition(v_t.tbl, v_t.key, v_lo, v_hi);
                RETURN QUERY SELECT 'created'::text, v_t.tbl,
                    v_t.tbl || '_p' || to_char(v_lo AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MI'), v_count;
            EXCEPTION
                WHEN lock_not_available THEN
                    RETURN QUERY SELECT 'lock_busy'::text, v_t.tbl, null::text, 0::bigint;
                    EXIT;
            END;
            v_lo := v_hi;
        END LOOP;
    END LOOP;

    FOR v_i IN 1 .. cardinality(v_drop) LOOP
        BEGIN
            EXECUTE format('LOCK TABLE mailroom.%I IN ACCESS EXCLUSIVE MODE', v_drop_table[v_i]);
            -- checked again under the lock: an operator may have re-queued a failed message
            IF v_drop_table[v_i] = 'outbound_messages'
                AND mailroom_internal._outbound_partition_live(v_drop[v_i], null) THEN
                RETURN QUERY SELECT 'kept'::text, v_drop_table[v_i], v_drop[v_i], 0::bigint;
                CONTINUE;
            END IF;
            IF v_drop_table[v_i] = 'outbound_messages' THEN
                EXECUTE format(
                    'DELETE FROM mailroom.outbound_idempotency_keys AS k USING mailroom.%I AS m '
                    'WHERE m.idempotency_key IS NOT NULL AND k.scope = m.idempotency_scope '
                    'AND k.key = m.idempotency_key AND k.message_id = m.id',
                    v_drop[v_i]
                );
            END IF;
            IF v_drop_table[v_i] = 'tokens' THEN
                PERFORM mailroom_internal._forget_token_digests(v_drop[v_i]);
            END IF;
            EXECUTE format('DROP TABLE mailroom.%I', v_drop[v_i]);
            RETURN QUERY SELECT 'dropped'::text, v_drop_table[v_i], v_drop[v_i], v_drop_rows[v_i];
        EXCEPTION
            -- object_in_use: the calling transaction has pending trigger events on it
            WHEN lock_not_available OR object_in_use THEN
                RETURN QUERY SELECT 'lock_busy'::text, v_drop_table[v_i], v_drop[v_i], 0::bigint;
        END;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._maintain_partitions() IS
'Internal: the work of maintain_partitions (create ahead, drop past retention, batch-delete the rest), its report rows.';

CREATE OR REPLACE FUNCTION mailroom.maintain_partitions()
RETURNS TABLE (action text, table_name text, partition_name text, row_count bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_actions text [] := '{}';
    v_counts bigint [] := '{}';
BEGIN
    -- The work, then its summary in mailroom.job_runs (whoever runs it: a worker, pg_cron, an
    -- operator), which `mailroom status` shows as the last maintenance. A skipped call records nothing.
    FOR action, table_name, partition_name, row_count IN SELECT * FROM mailroom_internal._maintain_partitions() LOOP
        v_actions := v_actions || action;
        v_counts := v_counts || row_count;
        RETURN NEXT;
    END LOOP;
    IF NOT 'skipped' = ANY(v_actions) THEN
        PERFORM mailroom_internal._record_job_run('maintain_partitions', mailroom_internal._maintenance_summary(v_actions, v_counts));
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom.maintain_partitions() IS
'Create partitions ahead, drop those wholly past retention with nothing live, batch-delete the rest; one caller at a time (others: skipped). Returns (action, table, partition, rows); the run is recorded in mailroom.job_runs.';

GRANT EXECUTE ON FUNCTION mailroom.maintain_partitions() TO mailroom_inbound, mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom_internal._maintenance_summary(p_actions text[], p_counts bigint[])
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- 'created 3, dropped 1 (120 rows)', or 'nothing to do': the report of one run in one line
    SELECT coalesce(
        string_agg(
            a.action || ' ' || a.n || CASE WHEN a.action IN ('dropped', 'deleted', 'kept_deleted')
                THEN ' (' || a.total || ' rows)' ELSE '' END,
            ', ' ORDER BY a.first
        ),
        'nothing to do'
    )
    FROM (
        SELECT u.action, count(*) AS n, sum(u.n) AS total, min(u.i) AS first
        FROM unnest(p_actions, p_counts) WITH ORDINALITY AS u (action, n, i)
        GROUP BY u.action
    ) AS a
$$;

COMMENT ON FUNCTION mailroom_internal._maintenance_summary(text[], bigint[]) IS
'Internal: one line for the report rows of maintain_partitions (action and count, rows for deletions), or nothing to do.';

CREATE OR REPLACE FUNCTION mailroom_internal._record_job_run(p_job text, p_summary text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO mailroom.job_runs AS j (job, last_run_at, last_summary)
    VALUES (p_job, mailroom.clock(), left(p_summary, 500))
    ON CONFLICT (job) DO UPDATE
    SET last_run_at = excluded.last_run_at, last_summary = excluded.last_summary, runs = j.runs + 1
$$;

COMMENT ON FUNCTION mailroom_internal._record_job_run(text, text) IS
'Internal: record a completed run of a periodic job in mailroom.job_runs.';

CREATE OR REPLACE FUNCTION mailroom.job_runs()
RETURNS TABLE (job text, last_run_at timestamptz, age_seconds double precision, last_summary text, runs bigint)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.job, j.last_run_at, extract(EPOCH FROM mailroom.clock() - j.last_run_at)::double precision,
        j.last_summary, j.runs
    FROM mailroom.job_runs AS j
    ORDER BY j.job
$$;

COMMENT ON FUNCTION mailroom.job_runs() IS
'The last completed run of each periodic job (maintain_partitions): when, how long ago, what it did, runs so far.';

GRANT EXECUTE ON FUNCTION mailroom.job_runs() TO mailroom_monitor, mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.partition_status()
RETURNS TABLE (
    table_name text,
    partitions integer,
    oldest_from timestamptz,
    newest_to timestamptz,
    ahead_seconds double precision,
    default_rows_estimate bigint
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
BEGIN
    -- Per partitioned table: its time partitions (the DEFAULT one not counted), the range they
    -- cover, how far ahead of the clock (maintain_partitions keeps partitions.ahead), and the rows
    -- the DEFAULT partition holds by the planner's estimate (should be 0: a row there means a
    -- partition was missing when it came; maintain_partitions reports the exact count).
    RETURN QUERY
    SELECT
        t.tbl,
        (count(*) FILTER (WHERE NOT p.is_default))::integer,
        min(p.lower_bound),
        max(p.upper_bound),
        extract(EPOCH FROM max(p.upper_bound) - v_now)::double precision,
        coalesce(max(greatest(c.reltuples, 0)::bigint) FILTER (WHERE p.is_default), 0)
    FROM (VALUES ('outbound_messages'), ('messages'), ('tokens')) AS t (tbl)
    CROSS JOIN LATERAL mailroom_internal._partitions(t.tbl) AS p
    LEFT JOIN pg_catalog.pg_class AS c
        ON c.relname = p.partition_name AND c.relnamespace = 'mailroom'::pg_catalog.regnamespace
    GROUP BY t.tbl
    ORDER BY t.tbl;
END;
$$;

COMMENT ON FUNCTION mailroom.partition_status() IS
'Per partitioned table (outbound_messages, messages, tokens): partitions, the range they cover, seconds covered ahead of the clock, estimated rows in the DEFAULT partition.';

GRANT EXECUTE ON FUNCTION mailroom.partition_status() TO mailroom_monitor, mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom_internal._outbound_partition_live(p_partition text, p_cutoff timestamptz)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_live boolean;
BEGIN
    -- Live: queued, held or processing (three probes of the partition's partial indexes). p_cutoff
    -- is not needed: a sent, failed or cancelled row is past retention by its partition's range.
    EXECUTE format(
        'SELECT EXISTS (SELECT 1 FROM mailroom.%1$I WHERE status = ''queued'') '
        'OR EXISTS (SELECT 1 FROM mailroom.%1$I WHERE status = ''processing'') '
        'OR EXISTS (SELECT 1 FROM mailroom.%1$I WHERE status = ''held'')',
        p_partition
    ) INTO v_live;
    RETURN v_live;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._outbound_partition_live(text, timestamptz) IS
'Internal: whether an outbound partition holds a queued, held or processing row.';

CREATE OR REPLACE FUNCTION mailroom_internal._messages_partition_live(p_partition text, p_cutoff timestamptz)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_live boolean;
BEGIN
    -- Live: a message of a mailbox that is still active (open, or expired but not yet swept),
    -- or (DEFAULT partition) received after the cut-off.
    EXECUTE format(
        'SELECT EXISTS (SELECT 1 FROM mailroom.%I AS g JOIN mailroom.mailboxes AS b ON b.id = g.mailbox_id '
        'WHERE b.is_active OR g.received_at >= $1)',
        p_partition
    ) INTO v_live USING p_cutoff;
    RETURN v_live;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._messages_partition_live(text, timestamptz) IS
'Internal: whether a messages partition holds a message of an active mailbox or one received after p_cutoff.';

CREATE OR REPLACE FUNCTION mailroom_internal._tokens_partition_live(p_partition text, p_cutoff timestamptz)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_live boolean;
BEGIN
    -- Live: a token created after the cut-off, or one neither expired, consumed nor revoked
    -- before it (the recovery rate limit and consume_token still need it).
    EXECUTE format(
        'SELECT EXISTS (SELECT 1 FROM mailroom.%I AS t WHERE t.created_at >= $1 OR (t.expires_at >= $1 '
        'AND coalesce(t.consumed_at, t.revoked_at, ''infinity'') >= $1))',
        p_partition
    ) INTO v_live USING p_cutoff;
    RETURN v_live;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._tokens_partition_live(text, timestamptz) IS
'Internal: whether a tokens partition holds a token created, or still open, after p_cutoff.';

-- Its Citus form: sql/citus/25_maintenance.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._orphan_idempotency_keys(p_before timestamptz, p_limit integer)
RETURNS bigint[]
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- up to p_limit message ids of idempotency keys created before p_before whose message is
    -- gone (sql/citus/25 answers the same without joining the two tables across nodes)
    SELECT ARRAY(
        SELECT k.message_id
        FROM mailroom.outbound_idempotency_keys AS k
        WHERE k.created_at < p_before
            AND NOT EXISTS (SELECT 1 FROM mailroom.outbound_messages AS m WHERE m.id = k.message_id)
        LIMIT p_limit
    );
$$;

COMMENT ON FUNCTION mailroom_internal._orphan_idempotency_keys(timestamptz, integer) IS
'Internal: up to p_limit message ids of idempotency keys older than p_before whose message no longer exists.';

-- Its Citus form: sql/citus/12_accounts.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._delete_tokens_past_retention(
    p_partition text, p_cutoff timestamptz, p_batch integer
)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count bigint;
BEGIN
    -- closed or expired tokens of one partition, one batch (tokens stay on the coordinator on
    -- Citus, so sql/citus/25 calls this too)
    EXECUTE format(
        'WITH doomed AS (SELECT t.ctid AS row_id FROM mailroom.%1$I AS t WHERE t.created_at < $1 '
        'AND (t.expires_at < $1 OR t.consumed_at < $1 OR t.revoked_at < $1) '
        'LIMIT $2 FOR UPDATE SKIP LOCKED) '
        'DELETE FROM mailroom.%1$I AS t USING doomed AS d WHERE t.ctid = d.row_id',
        p_partition
    ) USING p_cutoff, p_batch;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_tokens_past_retention(text, timestamptz, integer) IS
'Internal: delete one batch of closed or expired tokens past retention from one tokens partition.';

-- A seam: nothing on one node. On Citus (sql/citus/13) the lookup rows of the digests of a tokens
-- partition about to be dropped are deleted (token_digests, distributed by digest).
-- Its Citus form: sql/citus/13_token_digests.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._forget_token_digests(p_partition text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM p_partition;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._forget_token_digests(text) IS
'Internal: before a tokens partition is dropped, forget its digests elsewhere (a no-op on one node; Citus: token_digests).';

-- One batch of rows past retention from a partition that cannot be dropped (SKIP LOCKED: a row
-- another transaction holds waits for the next run), by the table's seam.
CREATE OR REPLACE FUNCTION mailroom_internal._delete_past_retention(
    p_table text, p_partition text, p_cutoff timestamptz, p_batch integer
)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    CASE p_table
        WHEN 'outbound_messages' THEN
            RETURN mailroom_internal._delete_outbound_past_retention(p_partition, p_cutoff, p_batch);
        WHEN 'messages' THEN
            RETURN mailroom_internal._delete_messages_past_retention(p_partition, p_cutoff, p_batch);
        ELSE
            RETURN mailroom_internal._delete_tokens_past_retention(p_partition, p_cutoff, p_batch);
    END CASE;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_past_retention(text, text, timestamptz, integer) IS
'Internal: delete one batch of rows past retention (outbound sent/failed/cancelled, messages of inactive mailboxes, closed or expired tokens) from one partition.';

-- Its Citus form: sql/citus/25_maintenance.sql (a seam: mailroom.db.citus.SEAMS): lane by lane there.
CREATE OR REPLACE FUNCTION mailroom_internal._delete_outbound_past_retention(
    p_partition text, p_cutoff timestamptz, p_batch integer
)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count bigint;
BEGIN
    EXECUTE format(
        'WITH doomed AS (SELECT m.ctid AS row_id, m.id, m.idempotency_scope, m.idempotency_key '
        'FROM mailroom.%1$I AS m WHERE m.created_at < $1 AND m.status IN (''sent'', ''failed'', ''cancelled'') '
        'LIMIT $2 FOR UPDATE SKIP LOCKED), '
        'keys AS (DELETE FROM mailroom.outbound_idempotency_keys AS k USING doomed AS d '
        'WHERE k.scope = d.idempotency_scope AND k.key = d.idempotency_key AND k.message_id = d.id) '
        'DELETE FROM mailroom.%1$I AS m USING doomed AS d WHERE m.ctid = d.row_id',
        p_partition
    ) USING p_cutoff, p_batch;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_outbound_past_retention(text, timestamptz, integer) IS
'Internal (a Citus seam): delete one batch of sent, failed or cancelled messages past retention, and their idempotency keys, from one outbound_messages partition.';

-- Its Citus form: sql/citus/25_maintenance.sql (a seam: mailroom.db.citus.SEAMS): by mailbox there.
CREATE OR REPLACE FUNCTION mailroom_internal._delete_messages_past_retention(
    p_partition text, p_cutoff timestamptz, p_batch integer
)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count bigint;
BEGIN
    EXECUTE format(
        'WITH doomed AS (SELECT g.ctid AS row_id FROM mailroom.%1$I AS g '
        'JOIN mailroom.mailboxes AS b ON b.id = g.mailbox_id '
        'WHERE g.received_at < $1 AND NOT b.is_active LIMIT $2 FOR UPDATE OF g SKIP LOCKED) '
        'DELETE FROM mailroom.%1$I AS g USING doomed AS d WHERE g.ctid = d.row_id',
        p_partition
    ) USING p_cutoff, p_batch;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_messages_past_retention(text, timestamptz, integer) IS
'Internal (a Citus seam): delete one batch of messages of inactive mailboxes past retention from one messages partition.';
