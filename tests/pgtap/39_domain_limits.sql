-- Outbound: per recipient domain limits in the claim (max in flight, max per minute), the
-- domain backoff after a throttling reply, pattern matching and the admin API (docs/limits.md).
-- Two claimers racing for the last slot are in tests/outbound/test_domain_limits.py (two sessions). The
-- claim's plan with limits on over 200k rows (ANALYZE): tests/pgtap_fresh/39_domain_limits_plans.sql, on the
-- test cluster only. The clock is pinned before any installation existed, so the claim meets the test's rows
-- alone, and the domain limits are pinned to none but the default, as the settings are to their defaults
-- (docs/operations.md, "Verifying an installation").
BEGIN;
SELECT plan(56);
\ir fixtures/default_settings.sql

-- the domain limits of a fresh migrate: the default row alone, uncapped (rows of the installation's are
-- locked until the ROLLBACK: an admin's set_domain_limit meanwhile waits that long; a claim never does)
DELETE FROM mailroom.domain_limits WHERE pattern <> '*';
UPDATE mailroom.domain_limits SET max_in_flight = NULL, max_per_minute = NULL
WHERE pattern = '*' AND (max_in_flight IS NOT NULL OR max_per_minute IS NOT NULL);

SET LOCAL mailroom.clock = '2000-01-01 00:00:10Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);

-- ---------------------------------------------------------------- the recipient domain
SELECT is(mailroom_internal._recipient_domain(ARRAY['Alice@Mail.Example.COM.'], '{}', '{}'), 'mail.example.com',
    'the domain is lower case, without a trailing dot');
SELECT is(mailroom_internal._recipient_domain('{}', ARRAY['b@cc.test'], ARRAY['c@bcc.test']), 'cc.test',
    'without a to, the first cc counts; then the first bcc');
SELECT is(mailroom_internal._recipient_domain(ARRAY['a@one.test', 'b@two.test'], '{}', '{}'), 'one.test',
    'a message to several domains counts against its first recipient''s only');
SELECT is(mailroom_internal._recipient_domain('{}', '{}', '{}'), '', 'no recipient: the unknown domain ''''');
SELECT mailroom.enqueue_message('tap', ARRAY['X@Upper.Test'], 's', 't', p_bcc => ARRAY['y@other.test']);
SELECT is((SELECT rcpt_domain FROM mailroom.outbound_messages
     WHERE sender_id = (SELECT s.id FROM mailroom.senders AS s WHERE s.name = 'tap') AND created_at <= mailroom.clock()),
    'upper.test', 'enqueue_message fills rcpt_domain');
DELETE FROM mailroom.outbound_messages
WHERE sender_id = (SELECT s.id FROM mailroom.senders AS s WHERE s.name = 'tap') AND created_at <= mailroom.clock();

-- ---------------------------------------------------------------- patterns
SELECT is(mailroom_internal._domain_patterns('a.b.example.com'),
    ARRAY['a.b.example.com', '*.b.example.com', '*.example.com', '*.com', '*'],
    'the patterns of a domain, most specific first');
SELECT is(mailroom.set_domain_limit(' Example.COM. ', 5, NULL), 'example.com', 'set_domain_limit stores the normalized pattern');
SELECT is(mailroom.set_domain_limit('*.Example.com', 3, 100), '*.example.com', 'a *.domain pattern');
SELECT is((SELECT max_in_flight FROM mailroom_internal._domain_limit('example.com')), 5, 'the exact pattern governs the domain itself');
SELECT is((SELECT pattern FROM mailroom_internal._domain_limit('mx.eu.example.com')), '*.example.com', '*.example.com governs its subdomains at any depth');
SELECT is((SELECT pattern FROM mailroom_internal._domain_limit('example.org')), '*', 'anything else falls back to *');
SELECT is((SELECT pattern FROM mailroom_internal._domain_limit('notexample.com')), '*', '*.example.com does not match notexample.com');
SELECT is(mailroom.set_domain_limit('example.com', 7, 9), 'example.com', 'setting a pattern again changes it');
SELECT is(
    (SELECT array_agg(pattern || ':' || coalesce(max_in_flight::text, '-') || ':' || coalesce(max_per_minute::text, '-'))
     FROM mailroom.list_domain_limits()),
    ARRAY['*.example.com:3:100', 'example.com:7:9', '*:-:-'], 'list_domain_limits: every row, the default * last'
);
SELECT throws_ok($$SELECT mailroom.set_domain_limit('exa mple.com', 1, 1)$$, 'MR370', NULL, 'a bad pattern is MR370');
SELECT throws_ok($$SELECT mailroom.set_domain_limit('a.*.com', 1, 1)$$, 'MR370', NULL, 'a * inside a pattern is MR370');
SELECT throws_ok($$SELECT mailroom.set_domain_limit('x.test', 0, NULL)$$, 'MR371', NULL, 'a limit below 1 is MR371');
SELECT throws_ok($$SELECT mailroom.delete_domain_limit('*')$$, 'MR373', NULL, 'the default row cannot be removed (MR373)');
SELECT throws_ok($$SELECT mailroom.delete_domain_limit('nothing.test')$$, 'MR372', NULL, 'removing an unknown pattern is MR372');
SELECT is(mailroom.delete_domain_limit('EXAMPLE.com'), 'example.com', 'delete_domain_limit removes a pattern');
SELECT is((SELECT pattern FROM mailroom_internal._domain_limit('example.com')), '*', 'its domain falls back to the next pattern');
DELETE FROM mailroom.domain_limits WHERE pattern <> '*';

-- ---------------------------------------------------------------- max in flight, skipping to other domains
SELECT mailroom.set_domain_limit('capped.test', 2, NULL);
-- 30 messages for the capped domain first, then 3 for others: the head of the queue is capped.test
SELECT mailroom.enqueue_message('tap', ARRAY['r' || g || '@capped.test'], 'c' || g, 't') FROM generate_series(1, 30) AS g;
SELECT mailroom.enqueue_message('tap', ARRAY['r' || g || '@open' || g || '.test'], 'o' || g, 't') FROM generate_series(1, 3) AS g;

CREATE TEMP TABLE k1 ON COMMIT DROP AS SELECT * FROM mailroom.claim_messages(4, 'w1');
SELECT is(
    (SELECT array_agg(subject ORDER BY id) FROM k1), ARRAY['c1', 'c2'],
    'a claim takes at most max_in_flight of a capped domain (its window of the queue holds nothing else)'
);
CREATE TEMP TABLE k2 ON COMMIT DROP AS SELECT * FROM mailroom.claim_messages(10, 'w2');
SELECT is(
    (SELECT array_agg(subject ORDER BY id) FROM k2), ARRAY['o1', 'o2', 'o3'],
    'with the capped domain full, the next claim skips its 28 due rows to the other domains'
);
SELECT is((SELECT count(*)::integer FROM mailroom.claim_messages(10, 'w3')), 0, 'nothing else may go: capped.test is at its cap');
SELECT is(
    (SELECT result FROM mailroom.finalize_messages(
        ARRAY[(SELECT id FROM k1 WHERE subject = 'c1')], ARRAY[(SELECT claim_token FROM k1 WHERE subject = 'c1')],
        ARRAY['sent'])),
    'sent', 'one capped message is delivered'
);
SELECT is(
    (SELECT array_agg(subject) FROM mailroom.claim_messages(10, 'w4')), ARRAY['c3'],
    'a finished message frees exactly one slot'
);
SELECT is(
    (SELECT in_flight::integer || '/' || max_in_flight FROM mailroom.domain_status() WHERE domain = 'capped.test'),
    '2/2', 'domain_status shows the domain at its cap'
);
SELECT mailroom.release_messages(
    ARRAY(SELECT id FROM mailroom.outbound_messages WHERE status = 'processing' AND created_at <= mailroom.clock() ORDER BY id),
    ARRAY(SELECT claim_token FROM mailroom.outbound_messages
        WHERE status = 'processing' AND created_at <= mailroom.clock() ORDER BY id)
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.claim_messages(10, 'w5')), 2,
    'released messages leave the in-flight count'
);
SELECT mailroom.set_domain_limit('capped.test', NULL, NULL);
SELECT is((SELECT count(*)::integer FROM mailroom.claim_messages(100, 'w6')), 30, 'no cap: the rest goes in one claim');
DELETE FROM mailroom.outbound_messages WHERE created_at <= mailroom.clock();
DELETE FROM mailroom.domain_limits WHERE pattern <> '*';

-- ---------------------------------------------------------------- max per minute, pinned clock
SELECT mailroom.set_domain_limit('*.minute.test', NULL, 3);
SELECT mailroom.enqueue_message('tap', ARRAY['r' || g || '@a.minute.test'], 'm' || g, 't') FROM generate_series(1, 10) AS g;
SELECT mailroom.enqueue_message('tap', ARRAY['r@free.test'], 'free', 't');
CREATE TEMP TABLE p1 ON COMMIT DROP AS SELECT * FROM mailroom.claim_messages(100, 'w1');
SELECT is(
    (SELECT count(*)::integer FROM p1 WHERE subject LIKE 'm%') || '+' || (SELECT count(*) FROM p1 WHERE subject = 'free'),
    '3+1', 'max_per_minute: 3 of the domain in this minute, other domains unaffected'
);
SELECT is((SELECT count(*)::integer FROM mailroom.finalize_messages(
    ARRAY(SELECT id FROM p1 ORDER BY id), ARRAY(SELECT claim_token FROM p1 ORDER BY id), ARRAY(SELECT 'sent' FROM p1)
) WHERE result = 'sent'), 4, 'the four are sent');
SET LOCAL mailroom.clock = '2000-01-01 00:00:59.999Z';
SELECT is((SELECT count(*)::integer FROM mailroom.claim_messages(100, 'w2')), 0,
    'sent messages still count for their minute: nothing more until the minute ends');
SELECT is(
    (SELECT claimed_this_minute || '/' || max_per_minute FROM mailroom.domain_status() WHERE domain = 'a.minute.test'),
    '3/3', 'domain_status shows the claims of this minute'
);
SET LOCAL mailroom.clock = '2000-01-01 00:01:00Z';
CREATE TEMP TABLE p2 ON COMMIT DROP AS SELECT * FROM mailroom.claim_messages(100, 'w3');
SELECT is((SELECT count(*)::integer FROM p2), 3, 'a new minute: 3 more');
SELECT is(
    (SELECT window_start || ' ' || window_count FROM mailroom.domain_state WHERE domain = 'a.minute.test'),
    '2000-01-01 00:01:00+00 3', 'the count restarts with the minute'
);
SELECT mailroom.release_messages(ARRAY(SELECT id FROM p2 ORDER BY id), ARRAY(SELECT claim_token FROM p2 ORDER BY id));
SET LOCAL mailroom.clock = '2000-01-01 00:01:30Z';
SELECT is((SELECT count(*)::integer FROM mailroom.claim_messages(100, 'w4')), 0,
    'a released claim still counted in its minute (the rate is of claims)');
SET LOCAL mailroom.clock = '2000-01-01 00:02:00Z';
SELECT is((SELECT count(*)::integer FROM mailroom.claim_messages(2, 'w5')), 2, 'the limit of the call still applies');
DELETE FROM mailroom.outbound_messages WHERE created_at <= mailroom.clock();
DELETE FROM mailroom.domain_limits WHERE pattern <> '*';

-- ---------------------------------------------------------------- the domain backoff
SELECT ok(mailroom_internal._is_domain_throttle('reply', 421, '4.7.0', 'too many connections'), '421 is a throttle');
SELECT ok(mailroom_internal._is_domain_throttle('reply', 451, '4.7.1', 'greylisted'), '451 4.7.1 (greylisting) is a throttle');
SELECT ok(mailroom_internal._is_domain_throttle('reply', 450, NULL, 'try later'), '450 without an enhanced code is a throttle');
SELECT ok(mailroom_internal._is_domain_throttle('reply', 452, '4.5.3', 'Too many connections from your IP'), 'a 4yz saying too many connections is a throttle');
SELECT ok(NOT mailroom_internal._is_domain_throttle('reply', 450, '4.2.1', 'mailbox busy'), '450 4.2.1 (the mailbox) is not');
SELECT ok(NOT mailroom_internal._is_domain_throttle('reply', 550, '5.7.1', 'denied'), 'a 5xx is not');
SELECT ok(NOT mailroom_internal._is_domain_throttle('dropped', NULL, NULL, NULL), 'a dropped connection is not');

SET LOCAL mailroom.clock = '2000-01-01 00:00:00Z';
SELECT mailroom.enqueue_message('tap', ARRAY['r' || g || '@slow.test'], 's' || g, 't') FROM generate_series(1, 3) AS g;
SELECT mailroom.enqueue_message('tap', ARRAY['r' || g || '@fast.test'], 'f' || g, 't') FROM generate_series(1, 3) AS g;
CREATE TEMP TABLE b1 ON COMMIT DROP AS SELECT * FROM mailroom.claim_messages(1, 'w1');
CREATE TEMP TABLE r1 ON COMMIT DROP AS
SELECT * FROM mailroom.finalize_messages(
    ARRAY(SELECT id FROM b1), ARRAY(SELECT claim_token FROM b1), ARRAY['reply'], ARRAY[421], ARRAY['4.7.0'],
    ARRAY['421 4.7.0 too many connections, slow down']
);
SELECT is(
    (SELECT result || ' ' || next_retry_at FROM r1), 'retry 2000-01-01 00:01:00+00',
    'the throttled message itself follows the attempts² retry rule'
);
SELECT is(
    (SELECT backoff_until || ' ' || backoff_level FROM mailroom.domain_state WHERE domain = 'slow.test'),
    '2000-01-01 00:01:00+00 1', 'a 421 backs the domain off for outbound.domain_backoff_base'
);
SELECT is(
    (SELECT array_agg(subject ORDER BY id) FROM mailroom.claim_messages(100, 'w2')), ARRAY['f1', 'f2', 'f3'],
    'claim skips the backed-off domain and takes the others'
);
SET LOCAL mailroom.clock = '2000-01-01 00:00:59Z';
SELECT is((SELECT count(*)::integer FROM mailroom.claim_messages(100, 'w3')), 0, 'nothing of the domain before the backoff ends');
SET LOCAL mailroom.clock = '2000-01-01 00:01:00Z';
CREATE TEMP TABLE b2 ON COMMIT DROP AS SELECT * FROM mailroom.claim_messages(100, 'w4');
SELECT is((SELECT array_agg(subject ORDER BY id) FROM b2), ARRAY['s1', 's2', 's3'], 'when the backoff ends, the domain flows again');
SELECT is((SELECT array_agg(result ORDER BY id) FROM mailroom.finalize_messages(
    ARRAY(SELECT id FROM b2 ORDER BY id), ARRAY(SELECT claim_token FROM b2 ORDER BY id), ARRAY['reply', 'reply', 'sent'],
    ARRAY[451, 451, 250], ARRAY['4.7.1', '4.7.1', '2.0.0'], ARRAY['greylisted', 'greylisted', NULL]
)), ARRAY['retry', 'retry', 'sent'], 'two greylisted, one accepted');
SELECT is(
    (SELECT backoff_until || ' ' || backoff_level FROM mailroom.domain_state WHERE domain = 'slow.test'),
    '2000-01-01 00:03:00+00 2', 'the next episode doubles the backoff (a success in the same batch does not clear it)'
);
-- a reply from a message claimed before the backoff changes nothing
SET LOCAL mailroom.clock = '2000-01-01 00:02:00Z';
SELECT mailroom_internal._note_domain_outcomes('2000-01-01 00:02:00Z', ARRAY['slow.test'], '{}');
SELECT is(
    (SELECT backoff_until || ' ' || backoff_level FROM mailroom.domain_state WHERE domain = 'slow.test'),
    '2000-01-01 00:03:00+00 2', 'a throttle reported during the backoff does not extend it'
);
SET LOCAL mailroom.clock = '2000-01-01 00:10:00Z';
CREATE TEMP TABLE b3 ON COMMIT DROP AS SELECT * FROM mailroom.claim_messages(100, 'w5');
SELECT is((SELECT count(*)::integer FROM mailroom.finalize_messages(
    ARRAY(SELECT id FROM b3 ORDER BY id), ARRAY(SELECT claim_token FROM b3 ORDER BY id), ARRAY(SELECT 'sent' FROM b3)
) WHERE result = 'sent'), 2, 'the two retries are sent (their attempts² delay has passed too)');
SELECT is(
    (SELECT coalesce(backoff_until::text, 'none') || ' ' || backoff_level FROM mailroom.domain_state WHERE domain = 'slow.test'),
    'none 0', 'a success clears the backoff'
);
SELECT mailroom_internal._note_domain_outcomes('2000-01-01 00:10:00Z', ARRAY['slow.test'], '{}');
SELECT ok(mailroom.clear_domain_backoff('slow.test'), 'clear_domain_backoff lifts a backoff');
SELECT is(
    (SELECT count(*)::integer FROM mailroom.domain_state
     WHERE backoff_until IS NOT NULL AND domain IN ('capped.test', 'a.minute.test', 'free.test', 'slow.test', 'fast.test')), 0,
    'and no domain is backed off any more'
);

SELECT * FROM finish();
ROLLBACK;
