-- Partitions (sql/05_partitions.sql): the layout, the width setting's bound, where a row outside every
-- range lands, who may run maintain_partitions, its summary line. What maintain_partitions does across
-- partition boundaries (it creates and drops partitions: DDL) is tests/pgtap_fresh/05_partitions_maintenance.sql,
-- on the test cluster only; a concurrent second caller, tests/db/test_partitions.py.
BEGIN;
SELECT plan(9);
\ir fixtures/default_settings.sql

CREATE FUNCTION pg_temp.where_is(p_table text, p_id bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    EXECUTE format('SELECT tableoid::regclass::text FROM mailroom.%I WHERE id = $1', p_table) INTO v USING p_id;
    RETURN v;
END;
$$;

-- the layout
SELECT is(
    (SELECT c.relkind::text FROM pg_class AS c WHERE c.oid = 'mailroom.outbound_messages'::regclass), 'p',
    'outbound_messages is partitioned'
);
SELECT is(
    (SELECT pg_get_partkeydef('mailroom.messages'::regclass)), 'RANGE (received_at)',
    'messages is partitioned by received_at'
);
SELECT is(
    (SELECT pg_get_partkeydef('mailroom.tokens'::regclass)), 'RANGE (created_at)',
    'tokens is partitioned by created_at'
);
SELECT ok(
    (SELECT bool_and(EXISTS (SELECT 1 FROM mailroom_internal._partitions(t) AS p WHERE p.is_default))
     FROM unnest(ARRAY['outbound_messages', 'messages', 'tokens']) AS t),
    'each has a DEFAULT partition'
);
SELECT throws_ok(
    $$ SELECT mailroom.set_setting('partitions.outbound.width', '1 mon') $$, 'MR003', NULL,
    'a partition width is an interval of at most 28 days'
);

-- a row outside every range lands in the DEFAULT partition (the clock before any installation existed)
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);
SELECT is(
    pg_temp.where_is('outbound_messages', mailroom.enqueue_message('tap', ARRAY['x@example.com'], 'default', 't')),
    'mailroom.outbound_messages_default', 'a row outside every range lands in the DEFAULT partition'
);

-- who may run it
SELECT ok(
    (SELECT prosecdef FROM pg_proc WHERE oid = 'mailroom.maintain_partitions()'::regprocedure),
    'maintain_partitions is SECURITY DEFINER'
);
SELECT ok(
    has_function_privilege('mailroom_inbound', 'mailroom.maintain_partitions()', 'EXECUTE')
    AND has_function_privilege('mailroom_admin', 'mailroom.maintain_partitions()', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_app', 'mailroom.maintain_partitions()', 'EXECUTE'),
    'the expiry worker (mailroom_inbound) and mailroom_admin may run it, the application may not'
);

SELECT is(
    mailroom_internal._maintenance_summary(ARRAY['created', 'dropped', 'created', 'kept_deleted'], ARRAY[0, 120, 0, 3]::bigint []),
    'created 2, dropped 1 (120 rows), kept_deleted 1 (3 rows)', 'the summary: each action counted, rows where deleted'
);

SELECT * FROM finish();
ROLLBACK;
