-- The operator's verbs (sql/37_outbound_queue.sql): hold, release, cancel, delete, run now, retry;
-- their selections, dry runs and refusals; priorities in the claim (the due index still walked in
-- order); the queue's numbers (held back by limits is not due) and the queue by domain. The claim's plan
-- over 50k rows (ANALYZE): tests/pgtap_fresh/37_outbound_queue_plans.sql, on the test cluster only. The
-- clock is pinned before any installation existed: the claim, the verbs on all or a domain and the
-- numbers meet the rows made by then, the test's (docs/operations.md, "Verifying an installation").
BEGIN;
SELECT plan(66);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
SELECT mailroom.upsert_sender('q', 'robot@mailroom.test', '127.0.0.1', 2525);
CREATE TEMP TABLE m (name text PRIMARY KEY, id bigint);
INSERT INTO m VALUES
('a1', mailroom.enqueue_message('q', ARRAY['x1@a.example'], 's', 't')),
('a2', mailroom.enqueue_message('q', ARRAY['x2@a.example'], 's', 't')),
('b1', mailroom.enqueue_message('q', ARRAY['y1@b.example'], 's', 't')),
('b2', mailroom.enqueue_message('q', ARRAY['y2@B.Example'], 's', 't', p_send_after => '2000-01-02 00:00Z')),
('c1', mailroom.enqueue_message('q', ARRAY['z1@c.example'], 's', 't'));
CREATE FUNCTION pg_temp.id(p_name text) RETURNS bigint LANGUAGE sql AS $$ SELECT id FROM m WHERE name = p_name $$;
CREATE FUNCTION pg_temp.status(p_name text) RETURNS text LANGUAGE sql AS $$
    SELECT status::text FROM mailroom.outbound_messages WHERE id = pg_temp.id(p_name)
$$;

-- ---------------------------------------------------------------- selections
SELECT throws_ok($$SELECT * FROM mailroom.hold_messages()$$, 'MR344',
    'hold: name the messages one way: ids, a recipient domain, or all', 'no selection is MR344');
SELECT throws_ok($$SELECT * FROM mailroom.hold_messages(ARRAY[1], p_all => true)$$, 'MR344', NULL,
    'two selections at once are MR344');
SELECT throws_ok($$SELECT * FROM mailroom.cancel_messages(ARRAY[]::bigint[])$$, 'MR344', NULL, 'no id is MR344');
SELECT throws_ok($$SELECT * FROM mailroom.cancel_messages(ARRAY[1, NULL])$$, 'MR344', NULL, 'a NULL id is MR344');
SELECT throws_ok($$SELECT * FROM mailroom.cancel_messages(p_domain => ' . ')$$, 'MR344', NULL, 'an empty domain is MR344');
SELECT throws_ok($$SELECT * FROM mailroom.retry_messages(p_all => true, p_status => 'sent')$$, 'MR344',
    'retry applies to failed, cancelled, held messages, not to sent ones', 'a status the verb does not change is MR344');
SELECT throws_ok($$SELECT * FROM mailroom.hold_messages(p_all => true, p_status => 'lost')$$, 'MR343', NULL,
    'an unknown status is MR343');
SELECT throws_ok($$SELECT * FROM mailroom.hold_messages(ARRAY[999999])$$, 'MR340',
    'no outbound message with id 999999', 'one unknown id is MR340');

-- ---------------------------------------------------------------- hold, dry run first
SELECT results_eq(
    $$SELECT changed, in_flight, sample_ids FROM mailroom.hold_messages(p_domain => 'B.EXAMPLE.', p_dry_run => true)$$,
    $$VALUES (2::bigint, 0::bigint, ARRAY[pg_temp.id('b1'), pg_temp.id('b2')])$$,
    'a dry run says what a hold of a domain would change (case and trailing dot do not matter)'
);
SELECT is(pg_temp.status('b1') || pg_temp.status('b2'), 'queuedqueued', 'and changes nothing');
SELECT is((SELECT changed FROM mailroom.hold_messages(p_domain => 'b.example')), 2::bigint, 'hold a domain');
SELECT is(pg_temp.status('b1') || ' ' || pg_temp.status('b2'), 'held held', 'both held');
SELECT alike((SELECT error_log FROM mailroom.outbound_messages WHERE id = pg_temp.id('b1')),
    '2000-01-01T00:00:00Z held by operator', 'the hold is a line of error_log');
SELECT throws_ok(format('SELECT * FROM mailroom.hold_messages(ARRAY[%s])', pg_temp.id('b1')), 'MR341',
    format('message %s is held; hold applies to queued messages', pg_temp.id('b1')),
    'one message the verb does not apply to: MR341 names its status');
SELECT is(
    (SELECT array_agg(id ORDER BY id) FROM mailroom.claim_messages(10, 'w1')),
    ARRAY[pg_temp.id('a1'), pg_temp.id('a2'), pg_temp.id('c1')], 'the claim never takes a held message'
);
SELECT is(
    (SELECT row(changed, in_flight)::text FROM mailroom.hold_messages(p_all => true)), '(0,3)',
    'messages being delivered are never touched: counted in flight'
);
SELECT throws_ok(format('SELECT * FROM mailroom.cancel_messages(ARRAY[%s])', pg_temp.id('a1')), 'MR341',
    format('message %s is being delivered (processing): wait for its outcome', pg_temp.id('a1')),
    'one message in flight named alone: MR341');
SELECT is(
    (SELECT count(*)::integer FROM mailroom.finalize_messages(
        ARRAY(SELECT id FROM mailroom.outbound_messages WHERE status = 'processing' AND created_at <= mailroom.clock() ORDER BY id),
        ARRAY(SELECT claim_token FROM mailroom.outbound_messages
            WHERE status = 'processing' AND created_at <= mailroom.clock() ORDER BY id),
        ARRAY['reply', 'sent', 'reply'], ARRAY[451, 250, 550], ARRAY['4.2.0', NULL, '5.1.1'])),
    3, 'a1 deferred, a2 sent, c1 failed'
);

-- ---------------------------------------------------------------- release, run now
SELECT is((SELECT changed FROM mailroom.release_held_messages(ARRAY[pg_temp.id('b1')])), 1::bigint, 'release one');
SELECT is(pg_temp.status('b1'), 'queued', 'it is queued again');
SELECT is((SELECT due_now FROM mailroom.outbound_stats()), 1::bigint, 'due now: b1 (a1 waits for its retry)');
SELECT is((SELECT retries_waiting FROM mailroom.outbound_stats()), 1::bigint, 'a1 is a retry waiting');
SELECT results_eq(
    $$SELECT changed, sample_ids FROM mailroom.run_messages_now(p_all => true, p_dry_run => true)$$,
    $$VALUES (1::bigint, ARRAY[pg_temp.id('a1')])$$,
    'run now changes only what is not due yet (held b2 is not queued)'
);
SELECT is((SELECT changed FROM mailroom.run_messages_now(ARRAY[pg_temp.id('a1')])), 1::bigint, 'run a1 now');
SELECT is(
    (SELECT next_retry_at FROM mailroom.outbound_messages WHERE id = pg_temp.id('a1')), '2000-01-01 00:00Z'::timestamptz,
    'a1 is due now'
);
SELECT is((SELECT changed FROM mailroom.run_messages_now(ARRAY[pg_temp.id('a1')])), 0::bigint,
    'a message already due: nothing to change');
SELECT mailroom.set_domain_limit('*', NULL, NULL);
INSERT INTO mailroom.domain_state (domain, backoff_until, backoff_level) VALUES ('a.example', '2000-01-01 01:00Z', 2);
SELECT is((SELECT due_now FROM mailroom.outbound_stats()), 1::bigint,
    'a backed-off domain''s due message is not due now ...');
SELECT is((SELECT held_back FROM mailroom.outbound_stats()), 1::bigint, '... it is held back by limits');
SELECT is((SELECT changed FROM mailroom.run_messages_now(p_domain => 'a.example')), 0::bigint,
    'run now of the domain: its message is due already ...');
SELECT is((SELECT backoff_until FROM mailroom.domain_state WHERE domain = 'a.example'), NULL,
    '... and the domain''s backoff is lifted');
SELECT is((SELECT held_back FROM mailroom.outbound_stats()), 0::bigint, 'nothing held back any more');

-- ---------------------------------------------------------------- cancel, retry, suppressed recipients
SELECT is((SELECT changed FROM mailroom.cancel_messages(ARRAY[pg_temp.id('b1'), pg_temp.id('b2'), pg_temp.id('a2')])),
    2::bigint, 'cancel three ids: the sent one is left alone');
SELECT is(pg_temp.status('b1') || ' ' || pg_temp.status('b2') || ' ' || pg_temp.status('a2'), 'cancelled cancelled sent',
    'queued and held messages are cancelled');
SELECT is((SELECT cancelled FROM mailroom.outbound_stats()), 2::bigint, 'outbound_stats counts them');
SELECT is((SELECT array_agg(id ORDER BY id) FROM mailroom.claim_messages(10, 'w2')), ARRAY[pg_temp.id('a1')],
    'a cancelled message is never claimed');
SELECT mailroom.release_messages(ARRAY[pg_temp.id('a1')], ARRAY(SELECT claim_token FROM mailroom.outbound_messages
    WHERE id = pg_temp.id('a1')));
SELECT mailroom.suppress('y1@b.example', 'manual');
SELECT is((SELECT reason FROM mailroom.list_suppressions() WHERE address = 'z1@c.example'), 'hard_bounce',
    'the 550 to c1''s only recipient put it on the suppression list');
SELECT results_eq(
    $$SELECT changed, suppressed, sample_ids, suppressed_ids FROM mailroom.retry_messages(p_all => true, p_dry_run => true)$$,
    $$VALUES (1::bigint, 2::bigint, ARRAY[pg_temp.id('b2')], ARRAY[pg_temp.id('b1'), pg_temp.id('c1')])$$,
    'retry all: failed and cancelled ones, but those whose recipient is suppressed now are left out and counted'
);
SELECT throws_ok(format('SELECT mailroom.retry_message(%s)', pg_temp.id('b1')), 'MR318',
    format('message %s: to[1] is on the suppression list now', pg_temp.id('b1')),
    'retrying one message to a suppressed recipient is MR318, naming the position, never the address');
SELECT is((SELECT changed FROM mailroom.retry_messages(p_all => true)), 1::bigint, 'retry all');
SELECT is(pg_temp.status('b1') || ' ' || pg_temp.status('b2') || ' ' || pg_temp.status('c1'), 'cancelled queued failed',
    'the suppressed ones stay as they were');
SELECT results_eq(
    $$SELECT changed, suppressed FROM mailroom.retry_messages(ARRAY[pg_temp.id('c1')], p_include_suppressed => true)$$,
    $$VALUES (1::bigint, 1::bigint)$$,
    'p_include_suppressed retries it anyway (and still counts it)'
);
SELECT is(
    (SELECT row(status, attempts, next_retry_at, claim_token)::text FROM mailroom.outbound_messages WHERE id = pg_temp.id('c1')),
    '(queued,0,,)', 'a retried message is queued with a fresh budget, due now, holding no claim'
);
SELECT alike((SELECT error_log FROM mailroom.outbound_messages WHERE id = pg_temp.id('c1')), '%retried by operator',
    'the retry is a line of error_log');
SELECT is(mailroom.retry_failed_messages(), 0, 'retry_failed_messages: none failed any more');

-- ---------------------------------------------------------------- delete
SELECT mailroom.enqueue_message('q', ARRAY['k@d.example'], 's', 't', p_idempotency_key => 'key-1');
SELECT results_eq(
    $$SELECT changed FROM mailroom.delete_messages(p_domain => 'd.example')$$, $$VALUES (1::bigint)$$,
    'delete a domain''s messages'
);
SELECT is((SELECT count(*)::integer FROM mailroom.outbound_idempotency_keys WHERE key = 'key-1'), 0,
    'its idempotency key goes with it');
SELECT is((SELECT changed FROM mailroom.delete_messages(p_all => true, p_status => 'sent')), 1::bigint,
    'delete all sent messages');
SELECT is((SELECT count(*)::integer FROM mailroom.outbound_messages WHERE status = 'sent' AND created_at <= mailroom.clock()), 0,
    'none left');

-- ---------------------------------------------------------------- priorities
DELETE FROM mailroom.outbound_messages WHERE created_at <= mailroom.clock();
SELECT mailroom.enqueue_message('q', ARRAY['p@a.example'], 'plain', 't');
SELECT mailroom.enqueue_message('q', ARRAY['p@a.example'], 'bulk', 't', p_priority => -5);
SELECT mailroom.enqueue_message('q', ARRAY['p@a.example'], 'urgent', 't', p_priority => 7);
SELECT mailroom.enqueue_message('q', ARRAY['p@a.example'], 'plain later', 't');
SELECT throws_ok($$SELECT mailroom.enqueue_message('q', ARRAY['p@a.example'], 's', 't', p_priority => 11)$$, 'MR326',
    'priority must be between -10 (last) and 10 (first), got 11', 'a priority out of range is MR326');
CREATE FUNCTION pg_temp.claim_one_by_one(p_n integer) RETURNS text [] LANGUAGE plpgsql AS $$
DECLARE
    v_subjects text [] := '{}';
    v_subject text;
BEGIN
    FOR i IN 1 .. p_n LOOP
        SELECT c.subject INTO v_subject FROM mailroom.claim_messages(1, 'w3') AS c;
        v_subjects := v_subjects || v_subject;
    END LOOP;
    RETURN v_subjects;
END;
$$;
SELECT is(
    pg_temp.claim_one_by_one(4),
    ARRAY['urgent', 'plain', 'plain later', 'bulk'],
    'one at a time, the claim takes the higher priority first, then in due order'
);
SELECT is((SELECT array_agg(priority ORDER BY id) FROM mailroom.list_outbound_messages(p_domain => 'A.example')),
    ARRAY[0, -5, 7, 0]::smallint [], 'list_outbound_messages shows the priority, by domain');
SELECT is((SELECT priority FROM mailroom.show_outbound_message((SELECT max(id) FROM mailroom.outbound_messages WHERE created_at <= mailroom.clock()))),
    0::smallint, 'show_outbound_message shows it too');
SELECT mailroom.create_account('prio@example.com', 'prio');
SELECT mailroom.set_setting('collector.sender', 'q');
SELECT mailroom.enqueue_token_emails(10, decode(repeat('ab', 32), 'hex'));
SELECT is((SELECT priority FROM mailroom.outbound_messages WHERE created_at <= mailroom.clock() ORDER BY id DESC LIMIT 1), 5::smallint,
    'an activation email takes the setting collector.priority (5)');

-- ---------------------------------------------------------------- the queue by domain (mailq)
DELETE FROM mailroom.outbound_messages WHERE created_at <= mailroom.clock();
DELETE FROM mailroom.domain_state WHERE domain IN ('a.example', 'b.example', 'c.example', 'd.example');
SELECT mailroom.enqueue_message('q', ARRAY['r@big.example'], 's', 't') FROM generate_series(1, 3);
SELECT mailroom.enqueue_message('q', ARRAY['r@big.example'], 's', 't', p_send_after => '2000-01-01 02:00Z');
SELECT mailroom.enqueue_message('q', ARRAY['r@small.example'], 's', 't');
INSERT INTO mailroom.domain_state (domain, backoff_until, backoff_level) VALUES ('small.example', '2000-01-01 00:30Z', 1);
SET LOCAL mailroom.clock = '2000-01-01 00:10:00+00';
SELECT results_eq(
    $$SELECT domain, queued, due, held_back, deferred, scheduled, held, processing, oldest_age_seconds, backoff_until
      FROM mailroom.outbound_queue()$$,
    $$VALUES ('big.example', 4::bigint, 3::bigint, 0::bigint, 0::bigint, 1::bigint, 0::bigint, 0::bigint, 600::float8,
              NULL::timestamptz),
             ('small.example', 1, 0, 1, 0, 0, 0, 0, 600, '2000-01-01 00:30Z')$$,
    'outbound_queue: by domain, most first: due, held back by a backoff, scheduled, oldest age, the backoff'
);
SELECT throws_ok($$SELECT * FROM mailroom.outbound_queue(0)$$, 'MR343', NULL, 'a limit out of range is MR343');

-- ---------------------------------------------------------------- purge: a dry run counts all
UPDATE mailroom.outbound_messages SET status = 'sent', sent_at = '1999-12-01Z' WHERE created_at <= mailroom.clock();
SELECT is(mailroom.purge_sent_messages('2000-01-01Z', 2, p_dry_run => true), 5, 'a dry run counts every one (not a batch)');
SELECT is((SELECT count(*)::integer FROM mailroom.outbound_messages WHERE created_at <= mailroom.clock()), 5, 'and deletes nothing');
SELECT is(mailroom.purge_sent_messages('2000-01-01Z', 2), 2, 'a purge deletes one batch');

-- ---------------------------------------------------------------- held rows keep their partition
SELECT is(
    (SELECT indexdef ~ 'WHERE \(status = ''held''' FROM pg_indexes WHERE indexname = 'outbound_messages_held_idx'),
    true, 'held rows have their partial index (migration 0161)'
);
UPDATE mailroom.outbound_messages SET status = 'failed' WHERE created_at <= mailroom.clock();
SELECT ok(NOT mailroom_internal._outbound_partition_live('outbound_messages_default', NULL), 'failed rows only: not live');
UPDATE mailroom.outbound_messages SET status = 'held'
WHERE id = (SELECT min(id) FROM mailroom.outbound_messages WHERE created_at <= mailroom.clock());
SELECT ok(mailroom_internal._outbound_partition_live('outbound_messages_default', NULL),
    'a held row keeps its partition from being dropped');
-- a verb on a domain or on all, the numbers and the queue by domain take the messages made by now: a
-- session pinned before a message was made (db verify's files, pinned before any installation existed)
-- never counts, holds or locks it
SET LOCAL mailroom.clock = '2000-01-03 00:00Z';
SELECT mailroom.enqueue_message('q', ARRAY['r@later.example'], 's', 't') AS later_made \gset
SET LOCAL mailroom.clock = '2000-01-02 00:00Z';
SELECT is((SELECT queued FROM mailroom.outbound_stats()), 0::bigint, 'outbound_stats does not count a message made after the clock');
SELECT is((SELECT count(*)::integer FROM mailroom.outbound_queue(10000) WHERE domain = 'later.example'), 0,
    'nor does the queue by domain');
SELECT is((SELECT changed FROM mailroom.hold_messages(p_domain => 'later.example')), 0::bigint,
    'a verb on a domain leaves it alone');
SELECT is((SELECT changed FROM mailroom.hold_messages(p_all => true)), 0::bigint, 'nor a verb on all');
SELECT is((SELECT status::text FROM mailroom.outbound_messages WHERE id = :later_made), 'queued', 'it is still queued');
SELECT * FROM finish();
ROLLBACK;
