-- Outbound: finalize_messages (classification, backoff, max attempts, fencing), release, reaper.
BEGIN;
SELECT plan(85);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: the claim and the reaper meet the rows made by then, the
-- test's alone; every write below names them (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);
SELECT mailroom.enqueue_message('tap', ARRAY['a' || g || '@example.com'], 'm' || g, 't') FROM generate_series(1, 12) AS g;
CREATE TEMP TABLE ids ON COMMIT DROP AS
SELECT subject, id FROM mailroom.outbound_messages WHERE created_at <= mailroom.clock();
CREATE FUNCTION pg_temp.mid(text) RETURNS bigint LANGUAGE sql AS $$ SELECT id FROM ids WHERE subject = $1 $$;
CREATE FUNCTION pg_temp.tok(text) RETURNS bigint LANGUAGE sql AS $$
    SELECT claim_token FROM mailroom.outbound_messages WHERE id = pg_temp.mid($1) $$;
-- make exactly these queued rows due (everything else waits until 2099)
CREATE FUNCTION pg_temp.only_due(VARIADIC text []) RETURNS void LANGUAGE sql AS $$
    UPDATE mailroom.outbound_messages
    SET next_retry_at = CASE WHEN subject = ANY($1) THEN NULL ELSE '2099-01-01Z'::timestamptz END
    WHERE status = 'queued' AND created_at <= mailroom.clock() $$;
CREATE FUNCTION pg_temp.st(text) RETURNS text LANGUAGE sql AS $$
    SELECT status || ' ' || attempts || ' ' || coalesce(to_char(next_retry_at AT TIME ZONE 'UTC', 'HH24:MI'), '-')
    FROM mailroom.outbound_messages WHERE id = pg_temp.mid($1) $$;

-- classification (RFC 3463 enhanced code first, then the RFC 5321 reply code)
SELECT is(mailroom_internal._classify_outcome('sent', 250, '2.0.0'), 'sent', 'sent is sent');
SELECT is(mailroom_internal._classify_outcome('reply', 451, '4.7.1'), 'transient', '451 4.7.1 is transient');
SELECT is(mailroom_internal._classify_outcome('reply', 550, '5.1.1'), 'permanent', '550 5.1.1 is permanent');
SELECT is(mailroom_internal._classify_outcome('reply', 554, '4.7.0'), 'transient', 'a 4.x.x enhanced code wins over a 5yz reply');
SELECT is(mailroom_internal._classify_outcome('reply', 450, '5.2.2'), 'permanent', 'a 5.x.x enhanced code wins over a 4yz reply');
SELECT is(mailroom_internal._classify_outcome('reply', 552, NULL), 'permanent', 'no enhanced code: 5yz is permanent');
SELECT is(mailroom_internal._classify_outcome('reply', 421, NULL), 'transient', 'no enhanced code: 4yz is transient');
SELECT is(mailroom_internal._classify_outcome('dropped', NULL, NULL), 'transient', 'a dropped connection is transient');
SELECT is(mailroom_internal._classify_outcome('timeout', NULL, NULL), 'transient', 'a timeout is transient');
SELECT is(mailroom_internal._classify_outcome('local', NULL, NULL), 'permanent', 'an unbuildable message is permanent');

-- the reply class (the sender's metric label): a closed set decided in SQL
SELECT results_eq(
    $$SELECT mailroom_internal._reply_class(o, c) FROM (VALUES
        ('sent', 250), ('sent', NULL), ('reply', 421), ('reply', 499), ('reply', 500), ('reply', 599),
        ('reply', 250), ('reply', 600), ('reply', NULL), ('dropped', NULL), ('timeout', NULL),
        ('connect', 421), ('uncertain', NULL), ('local', NULL), ('exploded', 550)) AS t (o, c)$$,
    $$VALUES ('2xx'), ('2xx'), ('4xx'), ('4xx'), ('5xx'), ('5xx'), ('other'), ('other'), ('other'),
             ('dropped'), ('timeout'), ('connect'), ('uncertain'), ('local'), ('other')$$,
    '_reply_class: 2xx for sent, 4xx/5xx by reply code, the outcome for connection-level ones, else other'
);
SELECT ok(mailroom_internal._gives_up('transient', 3, 3), 'a transient outcome at max_attempts gives up');
SELECT ok(NOT mailroom_internal._gives_up('transient', 2, 3), 'before max_attempts it does not');
SELECT ok(NOT mailroom_internal._gives_up('permanent', 3, 3), 'a permanent failure fails without "giving up"');
SELECT is(
    mailroom.setting('outbound.max_attempts'), '11',
    'the default is the seed''s: the first attempt and up to 10 retries, 11 attempts in all'
);
SELECT ok(
    NOT mailroom_internal._gives_up('transient', 10, 11) AND mailroom_internal._gives_up('transient', 11, 11),
    'with the default, the 9th retry (attempt 10) retries again, the 10th retry (attempt 11) gives up'
);

-- many outcomes in one call
SELECT pg_temp.only_due('m1', 'm2', 'm3', 'm4', 'm5', 'm6', 'm7');
SELECT count(*) FROM mailroom.claim_messages(7, 'w1');
CREATE TEMP TABLE fin7 ON COMMIT DROP AS
SELECT * FROM mailroom.finalize_messages(
        ARRAY[pg_temp.mid('m1'), pg_temp.mid('m2'), pg_temp.mid('m3'), pg_temp.mid('m4'), pg_temp.mid('m5'),
              pg_temp.mid('m6'), pg_temp.mid('m7')],
        ARRAY[pg_temp.tok('m1'), pg_temp.tok('m2'), pg_temp.tok('m3'), pg_temp.tok('m4'), pg_temp.tok('m5'),
              pg_temp.tok('m6'), pg_temp.tok('m7')],
        ARRAY['sent', 'reply', 'reply', 'dropped', 'uncertain', 'local', 'timeout'],
        ARRAY[250, 451, 550, NULL, NULL, NULL, NULL],
        ARRAY['2.0.0', '4.7.1', '5.1.1', NULL, NULL, NULL, NULL],
        ARRAY[NULL, '451 4.7.1 <a2@example.com> greylisted', '550 5.1.1 <a3@example.com> unknown', 'lost',
              'lost after DATA', 'cannot build', 'timed out']);
SELECT results_eq(
    $$SELECT id, result FROM fin7$$,
    $$VALUES (pg_temp.mid('m1'), 'sent'), (pg_temp.mid('m2'), 'retry'), (pg_temp.mid('m3'), 'failed'),
             (pg_temp.mid('m4'), 'retry'), (pg_temp.mid('m5'), 'retry'), (pg_temp.mid('m6'), 'failed'),
             (pg_temp.mid('m7'), 'retry')$$,
    'one call records seven outcomes'
);
SELECT results_eq(
    $$SELECT kind, reply_class FROM fin7$$,
    $$VALUES ('sent', '2xx'), ('transient', '4xx'), ('permanent', '5xx'), ('transient', 'dropped'),
             ('transient', 'uncertain'), ('permanent', 'local'), ('transient', 'timeout')$$,
    'each row says the kind finalize decided and the reply class to label metrics with'
);
SELECT is(pg_temp.st('m1'), 'sent 1 -', 'sent: status sent, one attempt');
SELECT is(
    (SELECT sent_at FROM mailroom.outbound_messages WHERE id = pg_temp.mid('m1')), '2000-01-01 00:00Z'::timestamptz,
    'sent_at follows the clock'
);
SELECT is(pg_temp.st('m2'), 'queued 1 00:01', '4xx: queued again, next_retry_at = clock + 1² minutes');
SELECT is(pg_temp.st('m3'), 'failed 1 -', '5xx: failed at once');
SELECT is(pg_temp.st('m4'), 'queued 1 00:01', 'dropped: retried');
SELECT is(
    (SELECT possibly_sent FROM mailroom.outbound_messages WHERE id = pg_temp.mid('m5')), TRUE,
    'uncertain (lost after DATA): retried and flagged possibly_sent'
);
SELECT unalike(
    (SELECT string_agg(error_log, ' ') FROM mailroom.outbound_messages WHERE id IN (SELECT id FROM ids)), '%@%',
    'no address reaches error_log'
);
SELECT is(
    (SELECT claim_token FROM mailroom.outbound_messages WHERE id = pg_temp.mid('m2')), NULL,
    'a finalized row gives up its claim token'
);

-- backoff: attempts² minutes, then max attempts
UPDATE mailroom.outbound_messages SET next_retry_at = '2099-01-01Z'
WHERE status = 'queued' AND subject <> 'm2' AND created_at <= mailroom.clock();
SET LOCAL mailroom.clock = '2000-01-01 00:01Z';
SELECT count(*) FROM mailroom.claim_messages(100, 'w1');
SELECT mailroom.finalize_messages(ARRAY[pg_temp.mid('m2')], ARRAY[pg_temp.tok('m2')], ARRAY['reply'], ARRAY[421], ARRAY[NULL::text]);
SELECT is(pg_temp.st('m2'), 'queued 2 00:05', 'second transient failure: + 2² = 4 minutes');
SELECT mailroom.set_setting('outbound.max_attempts', '3');
SET LOCAL mailroom.clock = '2000-01-01 00:05Z';
SELECT count(*) FROM mailroom.claim_messages(100, 'w1');
SELECT mailroom.finalize_messages(ARRAY[pg_temp.mid('m2')], ARRAY[pg_temp.tok('m2')], ARRAY['reply'], ARRAY[421], ARRAY[NULL::text]);
SELECT is(pg_temp.st('m2'), 'failed 3 -', 'the third transient failure with max_attempts 3 fails the message');
SELECT matches(
    (SELECT error_log FROM mailroom.outbound_messages WHERE id = pg_temp.mid('m2')),
    'giving up after 3 attempts',
    'and says so in error_log'
);
SELECT mailroom.set_setting('outbound.max_attempts', '11');

-- the seed's "retry up to 10 times", through finalize_messages with the default: a message whose
-- first attempt and 8 retries failed (attempts 9) is retried twice more, then failed
SET LOCAL mailroom.clock = '2000-01-01 00:30Z';
-- (a domain of the test's own: an installation's backoff of its domains holds at any earlier clock)
SELECT mailroom.enqueue_message('tap', ARRAY['r13@m13.example'], 'm13', 't');
INSERT INTO ids SELECT subject, id FROM mailroom.outbound_messages WHERE subject = 'm13' AND created_at <= mailroom.clock();
UPDATE mailroom.outbound_messages SET attempts = 9 WHERE id = pg_temp.mid('m13');
SELECT pg_temp.only_due('m13');
SELECT count(*) FROM mailroom.claim_messages(100, 'w1');
SELECT is(
    (SELECT result FROM mailroom.finalize_messages(ARRAY[pg_temp.mid('m13')], ARRAY[pg_temp.tok('m13')],
        ARRAY['reply'], ARRAY[450], ARRAY['4.2.1'])),
    'retry', 'the 9th retry (attempt 10) fails transiently: a 10th retry is scheduled'
);
SELECT is(pg_temp.st('m13'), 'queued 10 02:10', 'queued, 10 attempts, next_retry_at = clock + 10² minutes');
SELECT pg_temp.only_due('m13');
SELECT count(*) FROM mailroom.claim_messages(100, 'w1');
SELECT is(
    (SELECT result FROM mailroom.finalize_messages(ARRAY[pg_temp.mid('m13')], ARRAY[pg_temp.tok('m13')],
        ARRAY['reply'], ARRAY[450], ARRAY['4.2.1'])),
    'failed', 'the 10th retry (attempt 11) fails transiently: the message is failed'
);
SELECT matches(
    (SELECT error_log FROM mailroom.outbound_messages WHERE id = pg_temp.mid('m13')),
    'attempt 11 reply[^\n]*\ngiving up after 11 attempts \(outbound\.max_attempts\)$',
    'error_log: giving up after 11 attempts'
);

-- fencing: reaped and re-claimed -> the old worker's outcome is ignored and counted
SET LOCAL mailroom.clock = '2000-01-01 01:00Z';
SELECT pg_temp.only_due('m8');
SELECT count(*) FROM mailroom.claim_messages(100, 'old');
CREATE TEMP TABLE old_claim ON COMMIT DROP AS SELECT pg_temp.tok('m8') AS token;
SET LOCAL mailroom.clock = '2000-01-01 01:10Z';
SELECT is(mailroom.reap_stuck_messages(), 1, 'the reaper takes back the expired claim');
SELECT is(pg_temp.st('m8'), 'queued 1 01:10', 'reaped: queued, the attempt counted, due at once');
SELECT is(
    (SELECT possibly_sent FROM mailroom.outbound_messages WHERE id = pg_temp.mid('m8')), TRUE,
    'reaped: flagged possibly_sent'
);
SELECT count(*) FROM mailroom.claim_messages(100, 'new');
SELECT is(
    (SELECT result FROM mailroom.finalize_messages(ARRAY[pg_temp.mid('m8')], ARRAY[(SELECT token FROM old_claim)], ARRAY['reply'], ARRAY[550], ARRAY['5.1.1'])),
    'stale',
    'the old worker''s outcome is ignored'
);
SELECT is(
    (SELECT status || ' ' || claimed_by FROM mailroom.outbound_messages WHERE id = pg_temp.mid('m8')), 'processing new',
    'and does not touch the new claim'
);
SELECT is(
    (SELECT value FROM mailroom.outbound_counters WHERE name = 'stale_outcomes'), 1::bigint,
    'ignored outcomes are counted'
);
SELECT is(
    (SELECT result FROM mailroom.finalize_messages(ARRAY[pg_temp.mid('m8')], ARRAY[pg_temp.tok('m8')], ARRAY['sent'])),
    'sent', 'the new claim finalizes'
);
SELECT is(
    (SELECT result || ' ' || kind || ' ' || reply_class
        FROM mailroom.finalize_messages(ARRAY[pg_temp.mid('m8')], ARRAY[(SELECT token FROM old_claim)], ARRAY['sent'])),
    'stale sent 2xx', 'an outcome for an already finalized row is stale too (still classified, for the metrics)'
);

-- reaped but not re-claimed: a late 'sent' still lands (avoids a duplicate), a late failure does not
SELECT pg_temp.only_due('m9', 'm10');
SELECT count(*) FROM mailroom.claim_messages(100, 'slow');
SET LOCAL mailroom.clock = '2000-01-01 02:00Z';
SELECT is(mailroom.reap_stuck_messages(), 2, 'two stuck rows reaped');
SELECT results_eq(
    $$SELECT result FROM mailroom.finalize_messages(
        ARRAY[pg_temp.mid('m9'), pg_temp.mid('m10')], ARRAY[pg_temp.tok('m9'), pg_temp.tok('m10')],
        ARRAY['sent', 'reply'], ARRAY[250, 451], ARRAY['2.0.0', '4.2.0'])$$,
    $$VALUES ('sent'), ('stale')$$,
    'a late sent after the reap is accepted, a late failure is not'
);

-- release: back to queued without counting an attempt
SELECT pg_temp.only_due('m11');
SELECT count(*) FROM mailroom.claim_messages(100, 'w');
SELECT is(mailroom.release_messages(ARRAY[pg_temp.mid('m11')], ARRAY[-1::bigint]), 0, 'release with a wrong token does nothing');
SELECT is(mailroom.release_messages(ARRAY[pg_temp.mid('m11')], ARRAY[pg_temp.tok('m11')]), 1, 'release with the token');
SELECT is(pg_temp.st('m11'), 'queued 0 -', 'released: queued, no attempt counted');

-- reaper: older_than, out of attempts
SELECT count(*) FROM mailroom.claim_messages(100, 'w');
SELECT is(mailroom.reap_stuck_messages(), 0, 'a live lease is not reaped');
SELECT is(mailroom.reap_stuck_messages('0 seconds'), 1, 'p_older_than reaps rows claimed longer ago');
UPDATE mailroom.outbound_messages SET attempts = 10 WHERE id = pg_temp.mid('m12');
SELECT pg_temp.only_due('m12');
SELECT count(*) FROM mailroom.claim_messages(100, 'w');
SELECT mailroom.reap_stuck_messages('0 seconds');
SELECT is(pg_temp.st('m12'), 'failed 11 -', 'a reaped row out of attempts (the default 11) fails');
SELECT matches(
    (SELECT error_log FROM mailroom.outbound_messages WHERE id = pg_temp.mid('m12')),
    'attempt 11 reaped: [^\n]*\ngiving up after 11 attempts \(outbound\.max_attempts\)$',
    'and says so in error_log with the same give-up line as finalize'
);
SELECT is(
    (
        SELECT string_agg(p.proname, ', ' ORDER BY p.proname)
        FROM pg_proc AS p
        WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace) AND p.prosrc ~ 'giving up after'
    ),
    '_attempt_log',
    'the give-up line is written in one helper only'
);
SELECT is(
    (
        SELECT string_agg(p.proname, ', ' ORDER BY p.proname)
        FROM pg_proc AS p
        WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace) AND p.prosrc ~ 'attempts \+ 1\s*(>=|<)\s*v_max'
    ),
    NULL,
    'the give-up rule (attempt >= outbound.max_attempts) is only in _gives_up'
);

SELECT throws_ok(
    $$SELECT * FROM mailroom.finalize_messages(ARRAY[1, 2]::bigint[], ARRAY[1]::bigint[], ARRAY['sent', 'sent'])$$,
    'MR330', NULL, 'arrays of different lengths are MR330'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.finalize_messages(ARRAY[1]::bigint[], ARRAY[1]::bigint[], ARRAY['delivered'])$$,
    'MR331', NULL, 'an unknown outcome is MR331'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.finalize_messages(ARRAY[1, 1]::bigint[], ARRAY[1, 2]::bigint[], ARRAY['sent', 'sent'])$$,
    'MR332', 'a message id appears more than once in one finalize call', 'a duplicate id is MR332'
);
SELECT ok(
    (SELECT proconfig @> ARRAY['enable_seqscan=off', 'enable_nestloop=off', 'jit=off']
        FROM pg_proc
        WHERE oid = 'mailroom.finalize_messages(bigint[],bigint[],text[],integer[],text[],text[])'::regprocedure),
    'finalize_messages looks rows up by primary key and hash-joins the batch (linear at any size), without JIT'
);

-- a batch whose replies quote addresses (the error_log trigger tags each one) stays fast
SET LOCAL mailroom.clock = '2000-01-02 00:00Z';
UPDATE mailroom.outbound_messages SET next_retry_at = '2099-01-01Z' WHERE status = 'queued' AND created_at <= mailroom.clock();
SELECT mailroom.enqueue_message('tap', ARRAY['bulk' || g || '@example.com'], 'bulk', 't') FROM generate_series(1, 300) AS g;
CREATE TEMP TABLE bulk ON COMMIT DROP AS SELECT id, claim_token FROM mailroom.claim_messages(300, 'bulk');
SET LOCAL statement_timeout = '5s';
CREATE TEMP TABLE bulk_out ON COMMIT DROP AS
SELECT * FROM mailroom.finalize_messages(
    ARRAY(SELECT id FROM bulk ORDER BY id), ARRAY(SELECT claim_token FROM bulk ORDER BY id),
    array_fill('reply'::text, ARRAY[300]), array_fill(550, ARRAY[300]), array_fill('5.1.1'::text, ARRAY[300]),
    ARRAY(SELECT '550 5.1.1 <bulk' || id || '@example.com> unknown' FROM bulk ORDER BY id)
);
SET LOCAL statement_timeout = 0;
SELECT is(
    (SELECT count(*)::integer FROM bulk_out WHERE result = 'failed'), 300,
    '300 outcomes with an address in each reply finalize within a 5 s statement timeout'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.outbound_messages AS m JOIN bulk USING (id) WHERE m.error_log ~ '@'),
    0,
    'and every quoted address was redacted'
);
SELECT throws_ok(
    $$SELECT mailroom.release_messages(ARRAY[1, 2]::bigint[], ARRAY[1]::bigint[])$$,
    'MR330', 'release arrays must be non-NULL and of equal length (ids, claim tokens)', 'release with unequal arrays is MR330'
);
SELECT throws_ok($$SELECT mailroom.reap_stuck_messages('-1 minute')$$, 'MR333', NULL, 'a negative reap interval is MR333');

-- the backoff formula, one definition: the settings' form is the pure form with the settings
SELECT is(mailroom_internal._retry_delay(3, interval '1 minute', 2, interval '1 day'), interval '9 minutes', 'base * attempts ^ exponent');
SELECT is(mailroom_internal._retry_delay(100, interval '1 minute', 2, interval '6 hours'), interval '6 hours', 'at most max');
SELECT is(
    mailroom_internal._retry_delay(4),
    mailroom_internal._retry_delay(
        4, mailroom.setting('outbound.backoff_base')::interval,
        mailroom.setting('outbound.backoff_exponent')::double precision, mailroom.setting('outbound.backoff_max')::interval
    ),
    '_retry_delay(n) applies the outbound.backoff_* settings'
);
SELECT is(
    mailroom_internal._later('2000-03-31 00:30Z', mailroom_internal._retry_delay(5, interval '1 hour', 2, interval '2 days')),
    timestamptz '2000-03-31 00:30Z' + interval '25 hours',
    '_later: the retry''s due time, the delay counted in seconds (25 hours, not a day and an hour)'
);
SET LOCAL timezone = 'Europe/Paris';
SELECT is(
    mailroom_internal._later('2000-03-31 00:30+01', interval '1 day'),
    timestamptz '2000-03-31 00:30+01' + interval '24 hours',
    '_later counts a day as 86,400 s across a DST change (timestamptz + interval would give 23 hours)'
);
RESET timezone;
SELECT is(
    mailroom_internal._domain_backoff_delay(3),
    mailroom_internal._domain_backoff_delay(
        3, mailroom.setting('outbound.domain_backoff_base')::interval, mailroom.setting('outbound.domain_backoff_max')::interval
    ),
    '_domain_backoff_delay(n) applies the outbound.domain_backoff_* settings to the pure form'
);

-- the Citus seam of reap_stuck_messages (mailroom.db.citus.SEAMS): one scope, the whole table, on one node
SELECT is(
    (SELECT array_agg(s.scope) FROM mailroom_internal._outbound_scopes() AS s (scope)),
    ARRAY['true'],
    'one node: one statement over all of outbound_messages (Citus: one a lane)'
);

-- the Citus seam of finalize and release (issue 46): one node is one lane, 0; no token names a lane
SELECT is(
    mailroom_internal._claim_lanes(ARRAY[1, 2, (1::bigint << 62) | (7 << 16) | 3]::bigint[]), null::integer[],
    'one node: a claim token names no lane (Citus: the lane in the token)'
);
SELECT is(
    (SELECT count(*) FROM mailroom.outbound_messages WHERE lane <> 0), 0::bigint,
    'one node: every outbound message is in lane 0'
);
-- the counters are written only when there is something to count (on Citus an UPDATE of no row is
-- still a write on the coordinator: a two-phase commit with the worker's)
CREATE TEMP TABLE counter_before AS
SELECT value, xmin::text AS version FROM mailroom.outbound_counters WHERE name = 'webhook_possible_duplicates';
SELECT is(
    ARRAY[
        mailroom_internal._count_outbound('webhook_possible_duplicates', 0)::text,
        (SELECT xmin::text FROM mailroom.outbound_counters WHERE name = 'webhook_possible_duplicates')
    ],
    ARRAY['0', (SELECT version FROM counter_before)],
    '_count_outbound of 0 answers 0 and writes no new version of the counter'
);
SELECT is(mailroom_internal._count_outbound('webhook_possible_duplicates', 2), 2::bigint, '_count_outbound of 2 answers 2');
SELECT is(
    (SELECT value FROM mailroom.outbound_counters WHERE name = 'webhook_possible_duplicates') - (SELECT value FROM counter_before),
    2::bigint,
    '_count_outbound of 2 adds 2'
);
UPDATE mailroom.outbound_counters SET value = (SELECT value FROM counter_before) WHERE name = 'webhook_possible_duplicates';

-- finalize_and_claim (issue 37, item 5): finalize_messages then claim_messages in one transaction
SET LOCAL mailroom.clock = '2000-01-03 00:00Z';
UPDATE mailroom.outbound_messages SET next_retry_at = '2099-01-01Z' WHERE status = 'queued' AND created_at <= mailroom.clock();
CREATE FUNCTION pg_temp.fid(text) RETURNS bigint LANGUAGE sql AS $$
    SELECT id FROM mailroom.outbound_messages WHERE subject = $1 AND created_at <= mailroom.clock() $$;
CREATE FUNCTION pg_temp.fst(text) RETURNS text LANGUAGE sql AS $$
    SELECT status || ' ' || attempts FROM mailroom.outbound_messages WHERE subject = $1 AND created_at <= mailroom.clock() $$;
SELECT mailroom.enqueue_message('tap', ARRAY['fc@fc.example'], s, 't', p_priority => p)
FROM (VALUES ('fc1', 0), ('fc2', 5), ('fc3', 0)) AS v (s, p);
CREATE TEMP TABLE fc_first ON COMMIT DROP AS SELECT id, claim_token FROM mailroom.claim_messages(1, 'fc');
SELECT is(
    (SELECT subject FROM mailroom.outbound_messages WHERE id = (SELECT id FROM fc_first)), 'fc2',
    'fc: the first claim takes the highest priority'
);
CREATE TEMP TABLE fc_out ON COMMIT DROP AS
SELECT * FROM mailroom.finalize_and_claim(
    1, 'fc', ARRAY(SELECT id FROM fc_first), ARRAY(SELECT claim_token FROM fc_first), ARRAY['sent']
);
SELECT results_eq(
    $$SELECT f.result, m.subject, f.message IS NULL FROM fc_out AS f JOIN mailroom.outbound_messages AS m USING (id)$$,
    $$VALUES ('sent', 'fc2'::text, true)$$,
    'finalize_and_claim: one outcome row per finalized message (as finalize_messages answers it, message NULL)'
);
SELECT results_eq(
    $$SELECT m.subject, m.status::text, m.claimed_by, m.claim_token = (f.message).claim_token
      FROM fc_out AS f JOIN mailroom.outbound_messages AS m ON m.id = (f.message).id WHERE f.id IS NULL$$,
    $$VALUES ('fc1'::text, 'processing', 'fc'::text, true)$$,
    'then the claimed rows (outcome columns NULL): the next due in claim order, under a new claim token'
);
SELECT is(
    pg_typeof((SELECT message FROM fc_out WHERE id IS NULL))::text, 'mailroom.claimed_message',
    'the claimed row is the claim''s row type, mailroom.claimed_message'
);
-- a transient outcome is retried later: the same call's claim does not take it back
CREATE TEMP TABLE fc_out2 ON COMMIT DROP AS
SELECT * FROM mailroom.finalize_and_claim(
    5, 'fc', ARRAY[pg_temp.fid('fc1')], ARRAY[(SELECT (message).claim_token FROM fc_out WHERE id IS NULL)],
    ARRAY['reply'], ARRAY[452], ARRAY['4.2.2']
);
SELECT results_eq(
    $$SELECT coalesce(f.result, 'claimed'), m.subject FROM fc_out2 AS f
      JOIN mailroom.outbound_messages AS m ON m.id = coalesce(f.id, (f.message).id) ORDER BY f.id NULLS LAST$$,
    $$VALUES ('retry'::text, 'fc1'::text), ('claimed', 'fc3')$$,
    'a retried message waits for its retry time: the claim of the same call takes only what is due'
);
-- the fence: an outcome under a lost claim token is stale, and the claim still runs
SELECT results_eq(
    $$SELECT coalesce(f.result, 'claimed') FROM mailroom.finalize_and_claim(
        1, 'fc', ARRAY[pg_temp.fid('fc3')], ARRAY[-1::bigint], ARRAY['sent']) AS f$$,
    $$VALUES ('stale'::text)$$,
    'an outcome under a claim token the message no longer holds is stale (nothing left due: no claimed row)'
);
SELECT is(pg_temp.fst('fc3'), 'processing 0', 'and the message keeps its claim');
-- one transaction: a claim that fails takes the finalize back with it
SELECT throws_ok(
    format($$SELECT * FROM mailroom.finalize_and_claim(0, 'fc', ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], ARRAY['sent'])$$,
        pg_temp.fid('fc3'), (SELECT claim_token FROM mailroom.outbound_messages WHERE subject = 'fc3')),
    'MR320', NULL, 'a bad claim limit is MR320'
);
SELECT is(pg_temp.fst('fc3'), 'processing 0', 'and the outcome of that call was not recorded');
-- issue 37: on a burst enqueued a moment before (no statistics), finalize finds its rows by the
-- primary key; the fence written as an OR of statuses was planned as a BitmapOr that walked the
-- whole due index (a partial index on the queued rows) for id = ANY
INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id)
SELECT s.id, ARRAY['burst' || g || '@example.com'], 'burst', 't', '<burst' || g || '@mailroom.test>'
FROM mailroom.senders AS s, generate_series(1, 10000) AS g WHERE s.name = 'tap';
CREATE TEMP TABLE fc_burst ON COMMIT DROP AS SELECT id, claim_token FROM mailroom.claim_messages(50, 'burst');
CREATE TEMP TABLE fc_due_scans ON COMMIT DROP AS
SELECT sum(pg_stat_get_xact_numscans(c.oid)) AS n FROM pg_class AS c
WHERE c.relkind = 'i' AND c.relname LIKE 'outbound\_messages%\_due\_idx';
SELECT is(
    (SELECT count(*)::integer FROM mailroom.finalize_messages(
        ARRAY(SELECT id FROM fc_burst), ARRAY(SELECT claim_token FROM fc_burst), array_fill('sent'::text, ARRAY[50])
    ) AS f WHERE f.result = 'sent'),
    50, 'a burst''s batch of 50 is finalized'
);
SELECT is(
    (SELECT sum(pg_stat_get_xact_numscans(c.oid)) FROM pg_class AS c
     WHERE c.relkind = 'i' AND c.relname LIKE 'outbound\_messages%\_due\_idx'),
    (SELECT n FROM fc_due_scans),
    'finalize of a burst without statistics never scans the due index'
);
DELETE FROM mailroom.outbound_messages WHERE subject = 'burst';
-- domain limits: the in-flight count the finalize leaves is the one the claim sees
SELECT mailroom.set_domain_limit('cap.example', 1, NULL);
SELECT mailroom.enqueue_message('tap', ARRAY['x@cap.example'], s, 't') FROM (VALUES ('cap1'), ('cap2')) AS v (s);
CREATE TEMP TABLE fc_cap ON COMMIT DROP AS SELECT id, claim_token FROM mailroom.claim_messages(5, 'fc');
SELECT is((SELECT count(*)::integer FROM fc_cap), 1, 'a domain capped at 1 in flight: one message claimed');
SELECT results_eq(
    $$SELECT coalesce(f.result, 'claimed'), m.subject FROM mailroom.finalize_and_claim(
        5, 'fc', ARRAY(SELECT id FROM fc_cap), ARRAY(SELECT claim_token FROM fc_cap), ARRAY['sent']) AS f
      JOIN mailroom.outbound_messages AS m ON m.id = coalesce(f.id, (f.message).id) ORDER BY f.id NULLS LAST$$,
    $$VALUES ('sent'::text, 'cap1'::text), ('claimed', 'cap2')$$,
    'finalize_and_claim frees the capped domain''s slot and takes its next message in the same call'
);

SELECT * FROM finish();
ROLLBACK;
