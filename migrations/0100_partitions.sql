-- Issue 14: mailroom.outbound_messages, mailroom.messages and mailroom.tokens become tables
-- RANGE-partitioned by time (created_at, received_at, created_at), with a DEFAULT partition
-- each; mailroom.maintain_partitions() (sql/05_partitions.sql) creates partitions ahead and drops
-- those wholly past retention. docs/retention.md describes the layout and this migration's lock.
--
-- The conversion is generic, so columns, defaults, CHECK constraints, generated columns,
-- comments, non-unique indexes, foreign keys, triggers and views that earlier migrations (or a
-- sibling branch's) added to a table are carried over without being named here:
--   lock the table ACCESS EXCLUSIVE; record its index, foreign key, trigger and view definitions;
--   rename it to <name>_old; CREATE TABLE <name> (LIKE <name>_old INCLUDING ALL EXCLUDING
--   INDEXES) PARTITION BY RANGE (<key>); create the partitions that cover the rows and the days
--   ahead, and the DEFAULT one; INSERT ... SELECT every row (OVERRIDING SYSTEM VALUE, so ids are
--   kept); drop <name>_old; move the identity sequence on past the old one (ids keep increasing,
--   none is reused); re-create the primary key as (id, <key>), then the recorded indexes,
--   foreign keys, triggers and views.
-- A UNIQUE index other than the primary key cannot span partitions unless it holds the partition
-- key: each one is listed below with what replaces it, and any other makes this migration fail
-- (rather than silently drop a uniqueness).

CREATE FUNCTION pg_temp.mr_partition_bound(p_width interval, p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql
IMMUTABLE
AS $$
    -- partition boundaries: multiples of the width from Monday 2000-01-03 00:00 UTC
    SELECT pg_catalog.date_bin(p_width, p_at, '2000-01-03 00:00:00+00'::timestamptz)
$$;

CREATE FUNCTION pg_temp.mr_name_partition_indexes(p_table text)
RETURNS void
LANGUAGE plpgsql
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

CREATE FUNCTION pg_temp.mr_partition(
    p_table text,
    p_key text,
    p_width interval,
    p_ahead interval,
    p_replaced_unique text[]
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_old regclass := format('mailroom.%I', p_table)::regclass;
    v_pk_name text;
    v_pk_cols text;
    v_indexes text [];
    v_fks text [];
    v_triggers text [];
    v_views record;
    v_view_defs text [] := '{}';
    v_view_names text [] := '{}';
    v_view_comments text [] := '{}';
    v_view_grants text [] := '{}';
    v_comment text;
    v_cols text;
    v_seq text;
    v_new_seq text;
    v_last bigint;
    v_called boolean;
    v_min timestamptz;
    v_max timestamptz;
    v_lo timestamptz;
    v_hi timestamptz;
    v_def text;
    v_bad text;
BEGIN
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', v_old);

    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint AS c WHERE c.confrelid = v_old AND c.contype = 'f') THEN
        RAISE EXCEPTION 'a foreign key references %: partitioning it would need that key to carry %', v_old, p_key;
    END IF;

    SELECT c.conname, string_agg(quote_ident(a.attname), ', ' ORDER BY k.ord)
    INTO v_pk_name, v_pk_cols
    FROM pg_catalog.pg_constraint AS c
    CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k (attnum, ord)
    JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
    WHERE c.conrelid = v_old AND c.contype = 'p'
    GROUP BY c.conname;

    SELECT string_agg(i.indexrelid::regclass::text, ', ') INTO v_bad
    FROM pg_catalog.pg_index AS i
    WHERE i.indrelid = v_old AND i.indisunique AND NOT i.indisprimary
        AND NOT (i.indexrelid::regclass::text = ANY (
            SELECT 'mailroom.' || r FROM unnest(p_replaced_unique) AS r
        ));
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'unique index % on % has no replacement in migration 0100', v_bad, v_old;
    END IF;

    -- the definitions, still naming mailroom.<table>: they are replayed after the old table is gone
    SELECT coalesce(array_agg(pg_catalog.pg_get_indexdef(i.indexrelid) ORDER BY i.indexrelid), '{}')
    INTO v_indexes
    FROM pg_catalog.pg_index AS i
    WHERE i.indrelid = v_old AND NOT i.indisunique;
    SELECT coalesce(array_agg(
        format('ALTER TABLE %s ADD CONSTRAINT %I %s', v_old, c.conname, pg_catalog.pg_get_constraintdef(c.oid))
        ORDER BY c.conname
    ), '{}')
    INTO v_fks
    FROM pg_catalog.pg_constraint AS c
    WHERE c.conrelid = v_old AND c.contype = 'f';
    SELECT coalesce(array_agg(pg_catalog.pg_get_triggerdef(t.oid) ORDER BY t.tgname), '{}')
    INTO v_triggers
    FROM pg_catalog.pg_trigger AS t
    WHERE t.tgrelid = v_old AND NOT t.tgisinternal;
    v_comment := pg_catalog.obj_description(v_old, 'pg_class');

    -- views on the table would follow the rename; they are dropped and re-created as they were
    FOR v_views IN
        SELECT DISTINCT v.oid, v.oid::regclass::text AS name
        FROM pg_catalog.pg_depend AS d
        JOIN pg_catalog.pg_rewrite AS w ON w.oid = d.objid
        JOIN pg_catalog.pg_class AS v ON v.oid = w.ev_class
        WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.refobjid = v_old AND v.oid <> v_old
    LOOP
        v_view_names := v_view_names || v_views.name;
        v_view_defs := v_view_defs || pg_catalog.pg_get_viewdef(v_views.oid);
        v_view_comments := v_view_comments || pg_catalog.obj_description(v_views.oid, 'pg_class');
        v_view_grants := v_view_grants || coalesce((
            SELECT string_agg(
                format('GRANT %s ON %s TO %I', x.privilege_type, v_views.name, r.rolname), '; '
            )
            FROM pg_catalog.pg_class AS c
            CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS x
            JOIN pg_catalog.pg_roles AS r ON r.oid = x.grantee
            WHERE c.oid = v_views.oid AND x.grantee <> c.relowner
        ), '');
        EXECUTE format('DROP VIEW %s', v_views.name);
    END LOOP;

    -- functions taking or returning the table's row type depend on it (sql/25_waiting.sql's
    -- _readable_message returns mailroom.messages): dropped here, the sql/ pass that follows
    -- every migrate re-creates them, with their comments and grants, on the new table
    FOR v_def IN
        SELECT DISTINCT d.objid::regprocedure::text
        FROM pg_catalog.pg_depend AS d
        JOIN pg_catalog.pg_type AS t ON t.oid = d.refobjid
        WHERE d.classid = 'pg_catalog.pg_proc'::regclass
            AND d.refclassid = 'pg_catalog.pg_type'::regclass
            AND (t.typrelid = v_old OR t.typelem = (SELECT c.reltype FROM pg_catalog.pg_class AS c WHERE c.oid = v_old))
    LOOP
        EXECUTE format('DROP FUNCTION %s', v_def);
    END LOOP;

    v_seq := pg_catalog.pg_get_serial_sequence(v_old::text, 'id');
    IF v_seq IS NOT NULL THEN
        EXECUTE format('SELECT last_value, is_called FROM %s', v_seq) INTO v_last, v_called;
    END IF;

    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO v_cols
    FROM pg_catalog.pg_attribute AS a
    WHERE a.attrelid = v_old AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '';

    EXECUTE format('ALTER TABLE %s RENAME TO %I', v_old, p_table || '_old');
    IF v_pk_name IS NOT NULL THEN
        EXECUTE format('ALTER INDEX mailroom.%I RENAME TO %I', v_pk_name, v_pk_name || '_old');
    END IF;
    FOR v_def IN SELECT unnest(p_replaced_unique) LOOP
        EXECUTE format('ALTER INDEX mailroom.%I RENAME TO %I', v_def, v_def || '_old');
    END LOOP;

    EXECUTE format(
        'CREATE TABLE mailroom.%I (LIKE mailroom.%I INCLUDING ALL EXCLUDING INDEXES) PARTITION BY RANGE (%I)',
        p_table, p_table || '_old', p_key
    );

    EXECUTE format('SELECT min(%1$I), max(%1$I) FROM mailroom.%2$I', p_key, p_table || '_old')
    INTO v_min, v_max;
    v_lo := pg_temp.mr_partition_bound(p_width, least(v_min, now()));
    v_hi := pg_temp.mr_partition_bound(p_width, greatest(v_max, now() + p_ahead)) + p_width;
    WHILE v_lo < v_hi LOOP
        EXECUTE format(
            'CREATE TABLE mailroom.%I PARTITION OF mailroom.%I FOR VALUES FROM (%L) TO (%L)',
            p_table || '_p' || to_char(v_lo AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MI'),
            p_table, v_lo, v_lo + p_width
        );
        v_lo := v_lo + p_width;
    END LOOP;
    EXECUTE format('CREATE TABLE mailroom.%I PARTITION OF mailroom.%I DEFAULT', p_table || '_default', p_table);

    EXECUTE format(
        'INSERT INTO mailroom.%1$I (%2$s) OVERRIDING SYSTEM VALUE SELECT %2$s FROM mailroom.%3$I',
        p_table, v_cols, p_table || '_old'
    );
    EXECUTE format('DROP TABLE mailroom.%I', p_table || '_old');

    v_new_seq := pg_catalog.pg_get_serial_sequence(format('mailroom.%I', p_table), 'id');
    IF v_seq IS NOT NULL AND v_new_seq IS NOT NULL THEN
        EXECUTE format('ALTER SEQUENCE %s RENAME TO %I', v_new_seq, split_part(v_seq, '.', 2));
        PERFORM pg_catalog.setval(v_seq, v_last, v_called);
    END IF;

    IF v_pk_name IS NOT NULL THEN
        EXECUTE format(
            'ALTER TABLE mailroom.%I ADD CONSTRAINT %I PRIMARY KEY (%s, %I)',
            p_table, v_pk_name, v_pk_cols, p_key
        );
    END IF;
    FOREACH v_def IN ARRAY v_indexes || v_fks || v_triggers LOOP
        EXECUTE v_def;
    END LOOP;
    PERFORM pg_temp.mr_name_partition_indexes(p_table);
    EXECUTE format('COMMENT ON TABLE mailroom.%I IS %L', p_table, v_comment);
    FOR i IN 1 .. coalesce(cardinality(v_view_names), 0) LOOP
        EXECUTE format('CREATE VIEW %s AS %s', v_view_names[i], v_view_defs[i]);
        EXECUTE format('COMMENT ON VIEW %s IS %L', v_view_names[i], v_view_comments[i]);
        IF v_view_grants[i] <> '' THEN
            EXECUTE v_view_grants[i];
        END IF;
    END LOOP;
END;
$$;

-- Settings of the partitioned layout (sql/05_partitions.sql reads them).
INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'partitions.messages.width', '1 day',
    'Width of a new partition of mailroom.messages (by received_at); applies to partitions created from now on.',
    'interval', '1 hour', '28 days'
),
(
    'partitions.outbound.width', '1 day',
    'Width of a new partition of mailroom.outbound_messages (by created_at); applies to partitions created from now on.',
    'interval', '1 hour', '28 days'
),
(
    'partitions.tokens.width', '7 days',
    'Width of a new partition of mailroom.tokens (by created_at); applies to partitions created from now on.',
    'interval', '1 hour', '28 days'
),
(
    'partitions.ahead', '7 days',
    'maintain_partitions keeps partitions created this far ahead of mailroom.clock().',
    'interval', '1 hour', '90 days'
),
(
    'partitions.delete_batch', '5000',
    'Rows past retention deleted per table per maintain_partitions call where a partition cannot be dropped.',
    'integer', '1', '100000'
),
(
    'partitions.lock_timeout', '1 second',
    'lock_timeout of maintain_partitions'' partition DDL; a partition whose lock is busy waits for the next run.',
    'interval', '10 milliseconds', '1 minute'
),
(
    'inbox.retention_grace', '7 days',
    'Inbound messages are kept the longest plan TTL (plans.max_ttl_minutes) plus this grace, then dropped with their partition.',
    'interval', '0 seconds', '365 days'
),
(
    'outbound.retention', '30 days',
    'Outbound messages sent or failed are kept this long after created_at, then dropped with their partition or deleted in batches.',
    'interval', '1 day', '3650 days'
),
(
    'tokens.retention', '7 days',
    'Tokens are kept this long after they expire (and after created_at), then dropped with their partition or deleted in batches.',
    'interval', '1 day', '3650 days'
)
ON CONFLICT (name) DO NOTHING;

-- outbound_messages: the idempotency key (unique per scope) moves to a small non-partitioned
-- table; the index on the partitioned table stays, non-unique, for look-ups.
CREATE TABLE mailroom.outbound_idempotency_keys (
    scope text NOT NULL,
    key text NOT NULL,
    -- NULL only inside the enqueuing transaction, between claiming the key and inserting the row
    message_id bigint,
    created_at timestamptz NOT NULL DEFAULT mailroom._clock_default(),
    CONSTRAINT outbound_idempotency_keys_pkey PRIMARY KEY (scope, key)
);

COMMENT ON TABLE mailroom.outbound_idempotency_keys IS
'Idempotency keys of outbound_messages, unique per scope across all partitions; a key lives as long as its message.';

CREATE INDEX outbound_idempotency_keys_created_idx ON mailroom.outbound_idempotency_keys (created_at);

INSERT INTO mailroom.outbound_idempotency_keys (scope, key, message_id, created_at)
SELECT
    m.idempotency_scope,
    m.idempotency_key,
    m.id,
    m.created_at
FROM mailroom.outbound_messages AS m
WHERE m.idempotency_key IS NOT null;

SELECT pg_temp.mr_partition(
    'outbound_messages', 'created_at',
    (
        SELECT s.value::interval FROM mailroom.settings AS s
        WHERE s.name = 'partitions.outbound.width'
    ),
    (
        SELECT s.value::interval FROM mailroom.settings AS s
        WHERE s.name = 'partitions.ahead'
    ),
    ARRAY['outbound_messages_idempotency_key_idx']
);

CREATE INDEX outbound_messages_idempotency_key_idx
ON mailroom.outbound_messages (idempotency_scope, idempotency_key)
WHERE idempotency_key IS NOT null;

SELECT pg_temp.mr_name_partition_indexes('outbound_messages');

-- messages: no unique index but the primary key
SELECT pg_temp.mr_partition(
    'messages', 'received_at',
    (
        SELECT s.value::interval FROM mailroom.settings AS s
        WHERE s.name = 'partitions.messages.width'
    ),
    (
        SELECT s.value::interval FROM mailroom.settings AS s
        WHERE s.name = 'partitions.ahead'
    ),
    '{}'
);

-- tokens: created_at is set by the BEFORE INSERT trigger when NULL; a row must reach its
-- partition with it already (PostgreSQL cannot move a row to another partition from a BEFORE
-- trigger), so it gets the clock default the outbound tables have (migration 0062).
ALTER TABLE mailroom.tokens ALTER COLUMN created_at SET DEFAULT mailroom._clock_default();

-- tokens: secret_digest is sha256 of 32 random bytes; its UNIQUE constraint becomes a plain
-- index (docs/retention.md: a collision is a 2^-128 event, and every look-up is an index probe
-- per partition, their number bounded by tokens.retention / partitions.tokens.width).
SELECT pg_temp.mr_partition(
    'tokens', 'created_at',
    (
        SELECT s.value::interval FROM mailroom.settings AS s
        WHERE s.name = 'partitions.tokens.width'
    ),
    (
        SELECT s.value::interval FROM mailroom.settings AS s
        WHERE s.name = 'partitions.ahead'
    ),
    ARRAY['tokens_secret_digest_key']
);

CREATE INDEX tokens_secret_digest_idx ON mailroom.tokens (secret_digest);

SELECT pg_temp.mr_name_partition_indexes('tokens');
