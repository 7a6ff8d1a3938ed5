-- Fault injection (sql/24_faults.sql): an inbox's fault answers at RCPT (check_bounce_recipient),
-- at DATA without storing or after DATA having stored (deliver_messages), for every message, a share
-- or the next N; a catch-all domain's fault for its inboxes; the setters validate their input and
-- authorize like the other inbox functions. The real server: tests/inboxes/test_faults.py.
BEGIN;
SELECT plan(51);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';

CREATE TEMP TABLE b AS SELECT 'a' AS k, * FROM mailroom.create_mailbox(60, 'free');
INSERT INTO b SELECT 'b', * FROM mailroom.create_mailbox(60, 'free');

CREATE FUNCTION pg_temp.addr(p_k text) RETURNS text LANGUAGE sql AS $$ SELECT address FROM b WHERE k = p_k $$;
CREATE FUNCTION pg_temp.tok(p_k text) RETURNS text LANGUAGE sql AS $$ SELECT session_token FROM b WHERE k = p_k $$;
CREATE FUNCTION pg_temp.rcpt(p_k text) RETURNS text LANGUAGE sql AS $$
    SELECT row(c.verdict, c.reply)::text FROM mailroom.check_bounce_recipient(pg_temp.addr(p_k)) AS c
$$;
-- one message for the given inboxes, as the inbound server's DATA step stores it
CREATE FUNCTION pg_temp.data(p_ks text[]) RETURNS TABLE (verdict text, reply text, stored integer)
LANGUAGE sql AS $$
    SELECT d.verdict, d.reply, cardinality(d.message_ids)
    FROM mailroom.deliver_messages(
        array_fill(1, ARRAY[cardinality(p_ks)]), ARRAY(SELECT pg_temp.addr(k) FROM unnest(p_ks) AS k),
        ARRAY[convert_to(E'Subject: x\r\n\r\nhello\r\n', 'UTF8')], ARRAY['app@example.com'], ARRAY['x'], ARRAY[null::text],
        ARRAY['hello'], ARRAY[null::text], ARRAY['[]'::jsonb]
    ) AS d
$$;
CREATE FUNCTION pg_temp.count(p_k text) RETURNS integer LANGUAGE sql AS $$
    SELECT count(*)::int FROM mailroom.messages AS m JOIN b ON b.mailbox_id = m.mailbox_id WHERE b.k = p_k
$$;

-- no fault: nothing changes
SELECT is(pg_temp.rcpt('a'), '(ok,)', 'no fault: RCPT ok, no reply');
SELECT is(mailroom.inbox_fault(pg_temp.addr('a'), pg_temp.tok('a')), NULL, 'inbox_fault: NULL when none');

-- RCPT, every message
SELECT is(
    mailroom.set_inbox_fault(pg_temp.addr('a'), pg_temp.tok('a'), 'RCPT', ' 451 4.7.1 Try again later ')
        - 'set_at',
    '{"scope": "inbox", "stage": "rcpt", "reply": "451 4.7.1 Try again later", "share": 100, "remaining": null,
      "fired": 0, "active": true}'::jsonb,
    'set_inbox_fault returns the fault (stage lower case, reply trimmed, every message)'
);
SELECT is(pg_temp.rcpt('a'), '(fault,"451 4.7.1 Try again later")', 'RCPT: the fault''s verdict and reply');
SELECT is(pg_temp.rcpt('a'), '(fault,"451 4.7.1 Try again later")', 'and again: every message');
SELECT is(pg_temp.rcpt('b'), '(ok,)', 'another inbox is not touched');
SELECT is((SELECT verdict FROM mailroom.check_recipient(pg_temp.addr('a'))), 'ok',
    'check_recipient (mailbox_accepts, the SES hook) never sees a fault');
SELECT is((mailroom.inbox_fault(pg_temp.addr('a'), pg_temp.tok('a')) ->> 'fired')::int, 2, 'fired counts the answers');
SELECT is((SELECT verdict FROM pg_temp.data(ARRAY['a'])), 'ok', 'a RCPT fault leaves DATA alone');

-- the next N
SELECT lives_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L, p_count => 2)',
        pg_temp.addr('a'), pg_temp.tok('a'), 'rcpt', '550 5.1.1 No such user here'),
    'a fault for the next 2 replaces the first'
);
SELECT is(
    ARRAY[pg_temp.rcpt('a'), pg_temp.rcpt('a'), pg_temp.rcpt('a')],
    ARRAY['(fault,"550 5.1.1 No such user here")', '(fault,"550 5.1.1 No such user here")', '(ok,)'],
    'the next 2 RCPTs get it, the third is ok'
);
SELECT is(
    mailroom.inbox_fault(pg_temp.addr('a'), pg_temp.tok('a')) - 'set_at' - 'reply' - 'scope' - 'stage',
    '{"share": 100, "remaining": 0, "fired": 2, "active": false}'::jsonb,
    'spent: remaining 0, fired 2, no longer active (shown until cleared)'
);

-- a share
SELECT lives_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L, p_share => 0)',
        pg_temp.addr('a'), pg_temp.tok('a'), 'rcpt', '451 4.7.1 x'),
    'share 0'
);
SELECT is(
    (SELECT count(*)::int FROM generate_series(1, 50) WHERE pg_temp.rcpt('a') = '(ok,)'), 50,
    'share 0: never answers'
);
SELECT lives_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L, p_share => 50)',
        pg_temp.addr('a'), pg_temp.tok('a'), 'rcpt', '451 4.7.1 x'),
    'share 50'
);
SELECT cmp_ok(
    (SELECT count(*)::int FROM generate_series(1, 400) WHERE pg_temp.rcpt('a') LIKE '(fault,%'), '>', 120,
    'share 50: about half of 400 answer (more than 120: p < 1e-12 to fail by chance)'
);
SELECT cmp_ok(
    (mailroom.inbox_fault(pg_temp.addr('a'), pg_temp.tok('a')) ->> 'fired')::int, '<', 280,
    'and fewer than 280'
);

-- DATA: refused, nothing stored
SELECT lives_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L)', pg_temp.addr('a'), pg_temp.tok('a'), 'data',
        '554 5.7.1 Rejected by policy'),
    'a DATA fault'
);
SELECT is(pg_temp.rcpt('a'), '(ok,)', 'a DATA fault leaves RCPT ok');
SELECT is(
    (SELECT row(verdict, reply, stored)::text FROM pg_temp.data(ARRAY['a'])),
    '(fault,"554 5.7.1 Rejected by policy",0)', 'DATA: verdict fault, its reply, no message id'
);
SELECT is(pg_temp.count('a'), 1, 'nothing stored (the one message is from before)');
SELECT is(
    (SELECT row(verdict, reply, stored)::text FROM pg_temp.data(ARRAY['b', 'a'])),
    '(fault,"554 5.7.1 Rejected by policy",0)', 'with two recipients, one inbox''s fault refuses the message'
);
SELECT is(pg_temp.count('b'), 0, 'for both: nothing stored for the other');

-- after DATA: stored, then the reply
SELECT lives_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L, 100, 1)', pg_temp.addr('a'), pg_temp.tok('a'),
        'after-data', '451 4.3.0 Lost the acknowledgement'),
    'an after-DATA fault for the next message (after-data spelled with a hyphen)'
);
SELECT is(
    (SELECT row(verdict, reply, stored)::text FROM pg_temp.data(ARRAY['a'])),
    '(fault,"451 4.3.0 Lost the acknowledgement",1)', 'after DATA: stored (its id), answered the fault'
);
SELECT is(pg_temp.count('a'), 2, 'the message is in the inbox');
SELECT is(
    (SELECT row(verdict, stored)::text FROM pg_temp.data(ARRAY['a'])), '(ok,1)', 'the next message: 250 as usual'
);

-- clearing, authorization
SELECT throws_ok(
    format('SELECT mailroom.inbox_fault(%L, %L)', pg_temp.addr('a'), pg_temp.tok('b')), 'MR204', NULL,
    'inbox_fault: another inbox''s token is refused'
);
SELECT throws_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L)', pg_temp.addr('a'), 'wrong', 'rcpt', '451 4.7.1 x'),
    'MR204', NULL, 'set_inbox_fault: a wrong token is refused'
);
SELECT ok(mailroom.clear_inbox_fault(pg_temp.addr('a'), pg_temp.tok('a')), 'clear: true');
SELECT ok(NOT mailroom.clear_inbox_fault(pg_temp.addr('a'), pg_temp.tok('a')), 'clear again: false');
SELECT is(mailroom.inbox_fault(pg_temp.addr('a'), pg_temp.tok('a')), NULL, 'no fault any more');

-- validation
SELECT throws_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L)', pg_temp.addr('a'), pg_temp.tok('a'), 'helo', '451 4.7.1 x'),
    'MR230', NULL, 'an unknown stage: MR230'
);
SELECT throws_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L)', pg_temp.addr('a'), pg_temp.tok('a'), 'rcpt', '250 2.0.0 OK'),
    'MR231', NULL, 'a 2xx reply: MR231'
);
SELECT throws_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L)', pg_temp.addr('a'), pg_temp.tok('a'), 'rcpt', '451 5.7.1 x'),
    'MR231', 'the enhanced status code is of the reply''s class (4xx 4.x.x, 5xx 5.x.x)', 'another class: MR231'
);
SELECT throws_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L)', pg_temp.addr('a'), pg_temp.tok('a'), 'rcpt',
        E'451 4.7.1 x\r\n250 OK'),
    'MR231', NULL, 'CR LF in the reply (a second reply smuggled in): MR231'
);
SELECT throws_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L)', pg_temp.addr('a'), pg_temp.tok('a'), 'rcpt', '451 try later'),
    'MR231', NULL, 'no enhanced status code: MR231'
);
SELECT throws_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L, 100.5)', pg_temp.addr('a'), pg_temp.tok('a'), 'rcpt',
        '451 4.7.1 x'),
    'MR232', NULL, 'a share over 100: MR232'
);
SELECT throws_ok(
    format('SELECT mailroom.set_inbox_fault(%L, %L, %L, %L, 100, 0)', pg_temp.addr('a'), pg_temp.tok('a'), 'rcpt',
        '451 4.7.1 x'),
    'MR232', NULL, 'a count of 0: MR232'
);

-- a catch-all domain
SELECT lives_ok($$SELECT mailroom.set_catchall_domain('chaos.example', 'team-1')$$, 'a catch-all domain');
SELECT throws_ok($$SELECT mailroom.set_catchall_fault('nope.example', 'rcpt', '451 4.7.1 x')$$, 'MR233', NULL,
    'not a catch-all domain: MR233');
SELECT is(
    mailroom.set_catchall_fault('Chaos.Example', 'rcpt', '421 4.3.2 Service shutting down', 100, 1) ->> 'scope',
    'catchall_domain', 'set_catchall_fault'
);
SELECT is(
    (SELECT row(verdict, reply)::text FROM mailroom.check_bounce_recipient('new@chaos.example')),
    '(fault,"421 4.3.2 Service shutting down")', 'a catch-all inbox (created by this RCPT) answers its domain''s fault'
);
SELECT is(
    mailroom.inbox_fault('new@chaos.example', NULL, 'api', 'team-1') ->> 'scope', 'catchall_domain',
    'inbox_fault shows the domain''s fault for its inbox'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('new@chaos.example')), 'ok', 'count 1: then ok'
);
SELECT is(
    mailroom.set_inbox_fault('new@chaos.example', NULL, 'rcpt', '450 4.2.1 Busy', p_owner_type => 'api',
        p_owner_id => 'team-1') ->> 'scope',
    'inbox', 'an inbox''s own fault replaces its domain''s'
);
-- a purged inbox's fault never fires for a new inbox at its address (catch-all addresses come back)
SELECT lives_ok($$SELECT mailroom_internal._delete_mailbox('new@chaos.example')$$, 'the catch-all inbox is purged');
SELECT is(
    (SELECT row(verdict, reply)::text FROM mailroom.check_bounce_recipient('new@chaos.example')), '(ok,)',
    'a new inbox at its address: its domain''s fault is spent, the old inbox''s is not its'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.inbox_faults WHERE address = 'new@chaos.example'), 0,
    'and the old inbox''s fault is gone'
);
SELECT ok(mailroom.remove_catchall_domain('chaos.example'), 'the domain is removed');
SELECT ok(NOT mailroom.clear_catchall_fault('chaos.example'), 'and its fault with it');

SELECT * FROM finish();
ROLLBACK;
