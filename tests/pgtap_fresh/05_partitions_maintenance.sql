-- maintain_partitions (sql/05_partitions.sql) with a pinned clock across partition boundaries:
-- partitions are created ahead, those wholly past retention are dropped, and nothing queued,
-- processing, unexpired or in an active mailbox is ever dropped. (A concurrent second caller
-- needs a second session: tests/db/test_partitions.py.) On the test cluster only (tests/pgtap_fresh:
-- never shipped, never run by db verify): creating and dropping partitions is DDL, whose locks every
-- worker would wait for until the ROLLBACK. The layout and the grants: tests/pgtap/05_partitions.sql.
BEGIN;
SELECT plan(31);
\ir ../pgtap/fixtures/default_settings.sql

CREATE FUNCTION pg_temp.has_partition(p_table text, p_at timestamptz) RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (
        SELECT 1 FROM mailroom_internal._partitions(p_table) AS p
        WHERE p.lower_bound <= p_at AND p.upper_bound > p_at
    )
$$;
CREATE FUNCTION pg_temp.where_is(p_table text, p_id bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    EXECUTE format('SELECT tableoid::regclass::text FROM mailroom.%I WHERE id = $1', p_table) INTO v USING p_id;
    RETURN v;
END;
$$;
CREATE TEMP TABLE report (action text, table_name text, partition_name text, row_count bigint);

-- 1. partitions ahead
SET LOCAL mailroom.clock = '2030-01-01 12:00Z';
INSERT INTO report SELECT * FROM mailroom.maintain_partitions();
SELECT ok(
    pg_temp.has_partition('outbound_messages', '2030-01-01 12:00Z')
    AND pg_temp.has_partition('outbound_messages', '2030-01-08 11:00Z')
    AND pg_temp.has_partition('messages', '2030-01-08 11:00Z')
    AND pg_temp.has_partition('tokens', '2030-01-08 11:00Z'),
    'partitions are created partitions.ahead (7 days) ahead'
);
SELECT is(
    (SELECT count(*)::int FROM report WHERE action = 'created' AND table_name = 'outbound_messages'), 8,
    'eight daily outbound partitions were created (today and 7 days ahead), each reported'
);
SELECT is(
    (SELECT (p.upper_bound - p.lower_bound)::text FROM mailroom_internal._partitions('tokens') AS p
     WHERE p.lower_bound <= '2030-01-01 12:00Z' AND p.upper_bound > '2030-01-01 12:00Z'),
    '7 days', 'tokens partitions are weekly'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.maintain_partitions() AS r WHERE r.action = 'created'), 0,
    'a second run creates nothing'
);

-- fixtures across the daily boundaries of 2030-01-01, -02, -03 and in the DEFAULT partition
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);
INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id, status, created_at)
SELECT
    (SELECT id FROM mailroom.senders WHERE name = 'tap'), ARRAY['x@example.com'], v.subject, 't', '<' || v.subject || '@x>',
    v.status::mailroom.outbound_status, v.created_at::timestamptz
FROM (VALUES
    ('day1-sent', 'sent', '2030-01-01 01:00Z'),
    ('day1-failed', 'failed', '2030-01-01 23:59Z'),
    ('day2-queued', 'queued', '2030-01-02 00:00Z'),
    ('day2-sent', 'sent', '2030-01-02 10:00Z'),
    ('day3-processing', 'processing', '2030-01-03 10:00Z'),
    ('default-queued', 'queued', '2029-06-01 00:00Z')
) AS v (subject, status, created_at);
SELECT is(
    pg_temp.where_is('outbound_messages', (SELECT id FROM mailroom.outbound_messages WHERE subject = 'default-queued')),
    'mailroom.outbound_messages_default', 'a row outside every range lands in the DEFAULT partition'
);

INSERT INTO mailroom.mailboxes (address, plan, session_token_digest, expires_at, created_at, is_active, inactive_since)
VALUES
('open@p.test', 'free', '\x00', '2031-01-01Z', '2030-01-01Z', true, null),
('closed@p.test', 'free', '\x00', '2030-01-01 01:00Z', '2030-01-01Z', false, '2030-01-01 01:00Z');
INSERT INTO mailroom.messages (mailbox_id, raw, envelope_to, size_bytes, received_at, subject)
SELECT b.id, '\x00', b.address, 1, v.received_at::timestamptz, v.subject
FROM (VALUES
    ('open@p.test', 'open-day1', '2030-01-01 00:30Z'),
    ('closed@p.test', 'closed-day1', '2030-01-01 00:40Z'),
    ('closed@p.test', 'closed-day2', '2030-01-02 00:40Z')
) AS v (address, subject, received_at)
JOIN mailroom.mailboxes AS b ON b.address = v.address;

-- tokens: week of 2029-12-31 (all expired) and week of 2030-01-07 (one unexpired)
SELECT mailroom.create_account('old@p.test', 'old-p');
SET LOCAL mailroom.clock = '2030-01-08 12:00Z';
SELECT mailroom.create_account('live@p.test', 'live-p');
UPDATE mailroom.tokens SET expires_at = '2031-01-01Z'
WHERE account = (SELECT id FROM mailroom.accounts WHERE login = 'live-p');
SELECT isnt(
    pg_temp.where_is('tokens', (SELECT t.id FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'old-p')),
    pg_temp.where_is('tokens', (SELECT t.id FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'live-p')),
    'the two tokens are in different weekly partitions'
);

-- 2. idempotency keys hold across partitions
SET LOCAL mailroom.clock = '2030-01-01 12:00Z';
CREATE TEMP TABLE first_id AS
SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 'idem', 'body', p_idempotency_key => 'k-1') AS id;
SET LOCAL mailroom.clock = '2030-01-05 12:00Z';
SELECT is(
    mailroom.enqueue_message('tap', ARRAY['a@example.com'], 'idem', 'body', p_idempotency_key => 'k-1'),
    (SELECT id FROM first_id), 'the same key four days (and partitions) later returns the first message'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.outbound_messages WHERE idempotency_key = 'k-1'), 1,
    'and inserts no second row'
);
SELECT isnt(
    mailroom_internal._enqueue_message('mailroom', 'tap', ARRAY['a@example.com'], 'idem', 'body', p_idempotency_key => 'k-1'),
    (SELECT id FROM first_id), 'the same key in the other scope is another message'
);
SELECT throws_ok(
    $$ INSERT INTO mailroom.outbound_idempotency_keys (scope, key, message_id) VALUES ('app', 'k-1', 0) $$,
    '23505', NULL, 'the side table refuses a second row for a key'
);
-- the key's message is now 'sent' so its day can be dropped
UPDATE mailroom.outbound_messages SET status = 'sent' WHERE idempotency_key = 'k-1';

-- 3. past retention: outbound 30 days, messages 7 days (longest plan TTL) + 7 days grace,
--    tokens 7 days
SET LOCAL mailroom.clock = '2030-03-01 12:00Z';
SET CONSTRAINTS ALL IMMEDIATE;  -- a table with pending (deferred FK) trigger events cannot be dropped
TRUNCATE report;
INSERT INTO report SELECT * FROM mailroom.maintain_partitions();

SELECT ok(
    NOT pg_temp.has_partition('outbound_messages', '2030-01-01 12:00Z')
    AND EXISTS (SELECT 1 FROM report WHERE action = 'dropped' AND partition_name = 'outbound_messages_p20300101t0000'),
    'the outbound day with only sent and failed rows is dropped, and reported'
);
SELECT is(
    (SELECT row_count FROM report WHERE action = 'dropped' AND partition_name = 'outbound_messages_p20300101t0000'),
    3::bigint, 'the report counts its rows (sent, failed and the keyed message)'
);
SELECT ok(
    pg_temp.has_partition('outbound_messages', '2030-01-02 12:00Z')
    AND EXISTS (SELECT 1 FROM mailroom.outbound_messages WHERE subject = 'day2-queued'),
    'the day holding a queued row is kept, with the row'
);
SELECT is(
    (SELECT array_agg(subject ORDER BY subject) FROM mailroom.outbound_messages
     WHERE created_at >= '2030-01-02Z' AND created_at < '2030-01-03Z'),
    ARRAY['day2-queued'], 'its past-retention sent row is deleted in a batch'
);
SELECT ok(
    pg_temp.has_partition('outbound_messages', '2030-01-03 12:00Z')
    AND EXISTS (SELECT 1 FROM mailroom.outbound_messages WHERE subject = 'day3-processing'),
    'the day holding a processing row is kept'
);
SELECT ok(
    EXISTS (SELECT 1 FROM report WHERE action = 'default_rows' AND partition_name = 'outbound_messages_default' AND row_count = 1)
    AND EXISTS (SELECT 1 FROM mailroom.outbound_messages WHERE subject = 'default-queued'),
    'the queued row in the DEFAULT partition is reported and kept'
);
SELECT is(
    mailroom.enqueue_message('tap', ARRAY['a@example.com'], 'idem again', 'body', p_idempotency_key => 'k-1')
    <> (SELECT id FROM first_id), true,
    'once its message is dropped with its partition, the key is free again'
);

SELECT ok(
    pg_temp.has_partition('messages', '2030-01-01 12:00Z')
    AND EXISTS (SELECT 1 FROM mailroom.messages WHERE subject = 'open-day1'),
    'the inbound day holding a message of an open mailbox is kept'
);
SELECT is(
    (SELECT array_agg(subject) FROM mailroom.messages WHERE received_at < '2030-01-02Z' AND subject IN ('open-day1', 'closed-day1')),
    ARRAY['open-day1'],
    'its message of a closed mailbox is deleted in a batch'
);
SELECT ok(
    NOT pg_temp.has_partition('messages', '2030-01-02 12:00Z')
    AND NOT EXISTS (SELECT 1 FROM mailroom.messages WHERE subject = 'closed-day2'),
    'the inbound day with only closed-mailbox messages is dropped'
);

SELECT ok(
    NOT pg_temp.has_partition('tokens', '2030-01-01 12:00Z')
    AND NOT EXISTS (SELECT 1 FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'old-p'),
    'the week of expired tokens is dropped'
);
SELECT ok(
    pg_temp.has_partition('tokens', '2030-01-08 12:00Z')
    AND EXISTS (SELECT 1 FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'live-p'),
    'the week holding an unexpired token is kept'
);

SELECT ok(
    pg_temp.has_partition('outbound_messages', '2030-03-08 11:00Z') AND pg_temp.has_partition('tokens', '2030-03-08 11:00Z'),
    'and partitions ahead of the new time are created'
);
SELECT ok(
    NOT pg_temp.has_partition('outbound_messages', '2030-02-01 12:00Z'),
    'the gap between the old and the new time is left to the DEFAULT partition (no partition per missed day)'
);

-- 4. a row in the DEFAULT partition moves when its range gets a partition
SET LOCAL mailroom.clock = '2030-03-01 12:00Z';
INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id, created_at)
VALUES ((SELECT id FROM mailroom.senders WHERE name = 'tap'), ARRAY['x@example.com'], 'far', 't', '<far@x>', '2030-03-12 10:00Z');
-- delivery receipts (sql/21_delivery.sql) a day old go; younger ones stay
INSERT INTO mailroom.delivery_receipts (key, replies, created_at) VALUES
('00000000-0000-7000-8000-00000000000a', ARRAY['250 old'], '2030-03-05 11:59Z'),
('00000000-0000-7000-8000-00000000000b', ARRAY['250 new'], '2030-03-05 12:01Z');
SET LOCAL mailroom.clock = '2030-03-06 12:00Z';
TRUNCATE report;
INSERT INTO report SELECT * FROM mailroom.maintain_partitions();
SELECT is(
    (SELECT array_agg(replies[1] ORDER BY key) FROM mailroom.delivery_receipts),
    ARRAY['250 new'], 'maintain_partitions deletes delivery receipts older than a day, and only those'
);
SELECT is(
    (SELECT row_count FROM report WHERE action = 'receipts_deleted' AND table_name = 'delivery_receipts'),
    1::bigint, 'and reports them as receipts_deleted'
);
SELECT is(
    (SELECT row_count FROM report WHERE action = 'created' AND partition_name = 'outbound_messages_p20300312t0000'),
    1::bigint, 'creating a partition moves the rows of its range out of the DEFAULT partition'
);
SELECT is(
    pg_temp.where_is('outbound_messages', (SELECT id FROM mailroom.outbound_messages WHERE subject = 'far')),
    'mailroom.outbound_messages_p20300312t0000', 'the row is in its partition'
);

-- 6. the last maintenance, and the partitions, for `mailroom status`
SELECT is(
    (SELECT row(job, runs > 1, last_run_at)::text FROM mailroom.job_runs()),
    '(maintain_partitions,t,"2030-03-06 12:00:00+00")',
    'job_runs: maintain_partitions recorded its last run (by the clock) and counts runs'
);
SELECT ok((SELECT last_summary FROM mailroom.job_runs()) ~ '^(nothing to do|[a-z_]+ [0-9]+)',
    'with a one-line summary of what it did');
SELECT is(
    (SELECT array_agg(table_name ORDER BY table_name) FROM mailroom.partition_status() WHERE partitions > 0 AND ahead_seconds > 0),
    ARRAY['messages', 'outbound_messages', 'tokens'], 'partition_status: every table has partitions ahead of the clock'
);

SELECT * FROM finish();
ROLLBACK;
