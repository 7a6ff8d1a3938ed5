-- Outbound: the stats view, retry, purge, list/show, and documentation of the public API.
BEGIN;
SELECT plan(24);
\ir fixtures/default_settings.sql

-- the clock before any installation existed (the purge's cutoff meets the test's sent rows alone);
-- the stats of an installation's own rows at the moment the test reads them, to add the test's to
SET LOCAL mailroom.clock = '2000-01-01 00:01Z';
CREATE TEMP TABLE base AS SELECT * FROM mailroom.outbound_stats;
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);
SELECT mailroom.enqueue_message('tap', ARRAY['a' || g || '@example.com'], 'm' || g, 't') FROM generate_series(1, 6) AS g;
SELECT mailroom.enqueue_message('tap', ARRAY['later@example.com'], 'later', 't', p_send_after => '2000-01-02Z');
UPDATE mailroom.outbound_messages SET status = 'sent', attempts = 1, sent_at = '1999-12-01Z' WHERE subject IN ('m1', 'm2')
    AND sender_id = (SELECT id FROM mailroom.senders WHERE name = 'tap');
UPDATE mailroom.outbound_messages SET status = 'sent', attempts = 1, sent_at = '1999-12-31Z' WHERE subject = 'm3'
    AND sender_id = (SELECT id FROM mailroom.senders WHERE name = 'tap');
UPDATE mailroom.outbound_messages SET status = 'failed', attempts = 1 WHERE subject = 'm4'
    AND sender_id = (SELECT id FROM mailroom.senders WHERE name = 'tap');
UPDATE mailroom.outbound_messages SET attempts = 2, next_retry_at = '2000-01-01 00:04Z' WHERE subject = 'm5'
    AND sender_id = (SELECT id FROM mailroom.senders WHERE name = 'tap');
SET LOCAL mailroom.clock = '2000-01-01 00:01Z';

SELECT is(
    (SELECT ROW(queued, processing, sent, failed, due_now, retries_waiting)::text FROM mailroom.outbound_stats),
    (SELECT ROW(queued + 3, processing, sent + 3, failed + 1, due_now + 1, retries_waiting + 1)::text FROM base),
    'stats: counts per status, due now, retries waiting'
);
SELECT is(
    (SELECT oldest_queued_age_seconds FROM mailroom.outbound_stats),
    (SELECT greatest(oldest_queued_age_seconds, 60)::double precision FROM base),
    'stats: oldest eligible queued message is one minute old (pinned clock)'
);
SELECT is((SELECT stale_outcomes FROM mailroom.outbound_stats), (SELECT stale_outcomes FROM base), 'stats: stale outcome counter');
SELECT is(
    (SELECT s::text FROM mailroom.outbound_stats() AS s), (SELECT v::text FROM mailroom.outbound_stats AS v),
    'outbound_stats(): the row of the view'
);

SELECT is(
    (SELECT array_agg(subject ORDER BY id) FROM mailroom.outbound_messages m
        JOIN mailroom.list_outbound_messages('failed') l USING (id) WHERE m.sender_id = (SELECT id FROM mailroom.senders WHERE name = 'tap')),
    ARRAY['m4'],
    'list_outbound_messages filters by status'
);
SELECT is((SELECT count(*)::integer FROM mailroom.list_outbound_messages(NULL, 2)), 2, 'list_outbound_messages honours the limit');
SELECT throws_ok($$SELECT * FROM mailroom.list_outbound_messages('lost')$$, 'MR343', 'status must be queued, held, processing, sent, failed or cancelled, got ''lost''', 'an unknown status is MR343');
SELECT throws_ok($$SELECT * FROM mailroom.list_outbound_messages(NULL, 0)$$, 'MR343', NULL, 'a bad limit is MR343');
SELECT is(
    (SELECT status::text || ' ' || recipients FROM mailroom.show_outbound_message((SELECT id FROM mailroom.outbound_messages WHERE subject = 'm4'))),
    'failed 1',
    'show_outbound_message shows state and counts, not addresses'
);
SELECT is(
    (SELECT coalesce(idempotency_key, '-') || ' ' || idempotency_scope
        FROM mailroom.show_outbound_message((SELECT id FROM mailroom.outbound_messages WHERE subject = 'm4'))),
    '- app',
    'show_outbound_message shows the idempotency scope'
);
SELECT throws_ok($$SELECT * FROM mailroom.show_outbound_message(-1)$$, 'MR340', 'no outbound message with id -1', 'show of an unknown id is MR340');

SELECT is(
    mailroom.retry_message((SELECT id FROM mailroom.outbound_messages WHERE subject = 'm4')),
    (SELECT id FROM mailroom.outbound_messages WHERE subject = 'm4'),
    'retry_message returns the id'
);
SELECT is(
    (SELECT status || ' ' || attempts FROM mailroom.outbound_messages WHERE subject = 'm4'), 'queued 0',
    'retried: queued with a fresh attempt budget'
);
SELECT throws_ok(
    $$SELECT mailroom.retry_message((SELECT id FROM mailroom.outbound_messages WHERE subject = 'm4'))$$,
    'MR341', NULL, 'retrying a message that is not failed is MR341'
);
SELECT throws_ok($$SELECT mailroom.retry_message(-1)$$, 'MR340', NULL, 'retrying an unknown id is MR340');
UPDATE mailroom.outbound_messages SET status = 'failed' WHERE subject IN ('m4', 'm6')
    AND sender_id = (SELECT id FROM mailroom.senders WHERE name = 'tap');
SELECT is(mailroom.retry_failed_messages(), 2, 'retry_failed_messages requeues every failed message');

SELECT is(mailroom.purge_sent_messages('1999-12-15Z', 1), 1, 'purge deletes at most one batch');
SELECT is(mailroom.purge_sent_messages('1999-12-15Z', 1), 1, 'then the next batch');
SELECT is(mailroom.purge_sent_messages('1999-12-15Z', 1), 0, 'then nothing older is left');
SELECT is(
    (SELECT count(*)::integer FROM mailroom.outbound_messages
     WHERE status = 'sent' AND sender_id = (SELECT id FROM mailroom.senders WHERE name = 'tap')), 1,
    'newer sent messages are kept'
);
SELECT throws_ok($$SELECT mailroom.purge_sent_messages(NULL)$$, 'MR342', 'purge needs a cut-off time', 'purge without a cut-off is MR342');
SELECT throws_ok($$SELECT mailroom.purge_sent_messages(now(), 0)$$, 'MR342', NULL, 'purge with a bad batch is MR342');

SELECT is(
    (
        SELECT array_agg(p.proname::text ORDER BY p.proname)
        FROM pg_proc AS p
        WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)
            AND p.proname IN (
                'upsert_sender', 'enqueue_message', 'claim_messages', 'finalize_messages', 'release_messages',
                'reap_stuck_messages', 'redact_pii', 'retry_message', 'retry_failed_messages', 'purge_sent_messages',
                'list_outbound_messages', 'show_outbound_message'
            )
            AND obj_description(p.oid, 'pg_proc') IS NULL
    ),
    NULL,
    'every public outbound function has a COMMENT'
);
SELECT isnt(obj_description('mailroom.outbound_stats'::regclass, 'pg_class'), NULL, 'the stats view is documented');

SELECT * FROM finish();
ROLLBACK;
