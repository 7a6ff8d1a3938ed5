-- Fault injection (sql/24_faults.sql): an inbox's fault answers at RCPT (check_bounce_recipient),
-- at DATA without storing or after DATA having stored (deliver_messages), for every message, a share
-- or the next N; a catch-all domain's fault for its inboxes; the setters validate their input and
-- authorize like the other inbox functions. The real server: tests/inboxes/test_faults.py.
BEGIN;
SELECT plan(78);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';

CREATE TEMP TABLE b AS SELECT 'a' AS k, * FROM mailroom.create_mailbox(60, 'free');
INSERT INTO b SELECT 'b', * FROM mailroom.create_mailbox(60, 'free');
-- owned inboxes: a1, a2 and m1's owner id is owner-a (m1 of owner type mcp: another owner), b1's owner-b
INSERT INTO b SELECT 'a1', * FROM mailroom.create_mailbox(60, 'free', 'api', 'owner-a');
INSERT INTO b SELECT 'a2', * FROM mailroom.create_mailbox(60, 'free', 'api', 'owner-a');
INSERT INTO b SELECT 'm1', * FROM mailroom.create_mailbox(60, 'free', 'mcp', 'owner-a');
INSERT INTO b SELECT 'b1', * FROM mailroom.create_mailbox(60, 'free', 'api', 'owner-b');

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
-- the same with the current form (p_parsed) and its faults_skipped; a key k+tag is k's address with +tag,
-- a key not in b an address
CREATE FUNCTION pg_temp.deliver(p_ks text[])
RETURNS TABLE (verdict text, reply text, stored integer, skipped integer)
LANGUAGE sql AS $$
    SELECT d.verdict, d.reply, cardinality(d.message_ids), d.faults_skipped
    FROM mailroom.deliver_messages(
        p_message => array_fill(1, ARRAY[cardinality(p_ks)]),
        p_address => ARRAY(
            SELECT coalesce(
                pg_temp.addr(k), replace(pg_temp.addr(split_part(k, '+', 1)), '@', '+' || split_part(k, '+', 2) || '@'), k
            )
            FROM unnest(p_ks) WITH ORDINALITY AS u (k, n) ORDER BY n
        ),
        p_raw => ARRAY[convert_to(E'Subject: x\r\n\r\nhello\r\n', 'UTF8')], p_envelope_from => ARRAY['app@example.com'],
        p_parsed => ARRAY['{"subject": "x"}'::jsonb]
    ) AS d
$$;
CREATE FUNCTION pg_temp.owned_fault(p_k text, p_owner_type text, p_stage text, p_reply text, p_count integer DEFAULT null)
RETURNS jsonb LANGUAGE sql AS $$
    SELECT mailroom.set_inbox_fault(pg_temp.addr(p_k), NULL, p_stage, p_reply, 100, p_count, p_owner_type, 'owner-' || left(p_k, 1))
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
-- issue 45 item 2: before, one anonymous inbox's fault refused the message for the other as well
SELECT is(
    (SELECT row(verdict, stored, skipped)::text FROM pg_temp.deliver(ARRAY['b', 'a'])),
    '(ok,2,1)',
    'with another inbox''s recipient (each anonymous inbox its own owner): the fault is skipped, counted, stored for both'
);
SELECT is(pg_temp.count('b'), 1, 'the other inbox got its copy');

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
SELECT is(pg_temp.count('a'), 3, 'the message is in the inbox');
SELECT is(
    (SELECT row(verdict, stored)::text FROM pg_temp.data(ARRAY['a'])), '(ok,1)', 'the next message: 250 as usual'
);

-- A fault harms only its owner (issue 45 item 2): a DATA-stage fault answers a message only when every
-- recipient belongs to the fault's owner; otherwise skipped (faults_skipped), its count not taken
SELECT lives_ok($$SELECT pg_temp.owned_fault('a1', 'api', 'data', '550 5.7.1 Owner A says no')$$,
    'owner A sets a DATA fault on its inbox a1');
SELECT is(
    (SELECT row(verdict, reply, stored, skipped)::text FROM pg_temp.deliver(ARRAY['b1', 'a1'])),
    '(ok,"250 2.0.0 OK: stored for 2 recipient(s)",2,1)',
    'data: a transaction to owner B''s and owner A''s inboxes is not refused; the fault is skipped and counted'
);
SELECT is(pg_temp.count('b1'), 1, 'data: owner B''s inbox got its copy');
SELECT is(
    (SELECT row(verdict, reply, stored, skipped)::text FROM pg_temp.deliver(ARRAY['a1', 'a2'])),
    '(fault,"550 5.7.1 Owner A says no",0,0)', 'data: every recipient owner A''s: the fault answers'
);
SELECT is(
    (SELECT row(verdict, reply, stored, skipped)::text FROM pg_temp.deliver(ARRAY['a1'])),
    '(fault,"550 5.7.1 Owner A says no",0,0)', 'data: its own inbox alone: the fault answers'
);
SELECT is(
    (SELECT row(verdict, stored, skipped)::text FROM pg_temp.deliver(ARRAY['a2', 'a1', 'm1'])),
    '(ok,3,1)', 'data: the same owner id under another owner type (mcp) is another owner'
);
SELECT lives_ok($$SELECT pg_temp.owned_fault('a1', 'api', 'data', '550 5.7.1 Owner A says no', 1)$$,
    'the same fault for the next message only');
SELECT is((SELECT row(verdict, stored, skipped)::text FROM pg_temp.deliver(ARRAY['a1', 'b1'])), '(ok,2,1)',
    'skipped with owner B''s recipient');
SELECT is(
    (mailroom.inbox_fault(pg_temp.addr('a1'), NULL, 'api', 'owner-a') - 'set_at' - 'reply' - 'scope' - 'stage'),
    '{"share": 100, "remaining": 1, "fired": 0, "active": true}'::jsonb,
    'a skipped fault takes nothing of its count (the next message of owner A''s alone still gets it)'
);
SELECT lives_ok($$SELECT pg_temp.owned_fault('a1', 'api', 'after_data', '451 4.3.0 Owner A lost the ack')$$,
    'owner A sets an after-DATA 451 on a1');
SELECT is(
    (SELECT row(verdict, reply, stored, skipped)::text FROM pg_temp.deliver(ARRAY['a1', 'b1'])),
    '(ok,"250 2.0.0 OK: stored for 2 recipient(s)",2,1)',
    'after_data: stored for both and answered 250 (no retry to store owner B''s copy twice); skipped, counted'
);
SELECT is(pg_temp.count('b1'), 3, 'after_data: owner B''s inbox got that copy exactly once');
SELECT is(
    (SELECT row(verdict, reply, stored, skipped)::text FROM pg_temp.deliver(ARRAY['a2', 'a1'])),
    '(fault,"451 4.3.0 Owner A lost the ack",2,0)', 'after_data: every recipient owner A''s: stored, then the fault'
);
SELECT is(
    (SELECT row(verdict, stored, skipped)::text FROM pg_temp.deliver(ARRAY['a1', 'a1+tag', 'b1'])),
    '(ok,3,1)', 'a fault met through two forms of its address is counted once'
);
SELECT is(
    (SELECT row(verdict, reply)::text FROM pg_temp.deliver(ARRAY['b1', 'a2'])), '(ok,"250 2.0.0 OK: stored for 2 recipient(s)")',
    'recipients without a fault: as ever'
);
-- a RCPT fault answers only its own recipient's RCPT
SELECT lives_ok($$SELECT pg_temp.owned_fault('a1', 'api', 'rcpt', '550 5.1.1 Owner A refuses')$$, 'a RCPT fault on a1');
SELECT is(
    ARRAY[pg_temp.rcpt('a1'), pg_temp.rcpt('a2'), pg_temp.rcpt('b1')],
    ARRAY['(fault,"550 5.1.1 Owner A refuses")', '(ok,)', '(ok,)'],
    'RCPT: only a1''s RCPT gets it, not owner A''s other inbox nor owner B''s'
);
-- a catch-all domain's fault belongs to the catch-all's owner
SELECT lives_ok($$SELECT mailroom.set_catchall_domain('own.example', 'owner-a')$$, 'owner A''s catch-all domain');
SELECT lives_ok($$SELECT mailroom.set_catchall_fault('own.example', 'data', '554 5.7.1 Catch-all says no')$$,
    'with a DATA fault');
SELECT is((SELECT verdict FROM mailroom.check_bounce_recipient('c@own.example')), 'ok', 'an inbox of it (owner A''s)');
SELECT is(
    (SELECT row(verdict, reply, stored, skipped)::text FROM pg_temp.deliver(ARRAY['c@own.example', 'a2'])),
    '(fault,"554 5.7.1 Catch-all says no",0,0)', 'catch-all: with owner A''s other inbox the domain''s fault answers'
);
SELECT is(
    (SELECT row(verdict, stored, skipped)::text FROM pg_temp.deliver(ARRAY['c@own.example', 'b1'])),
    '(ok,2,1)', 'catch-all: with owner B''s inbox it is skipped'
);
SELECT lives_ok(
    $$SELECT mailroom_internal._insert_mailbox('anon@own.example', 'free', 'anonymous', NULL, '\x00'::bytea,
        mailroom.clock() + interval '1 hour', mailroom.clock(), NULL)$$,
    'an anonymous inbox at that domain (not made by the catch-all)'
);
SELECT is(
    (SELECT row(verdict, stored, skipped)::text FROM pg_temp.deliver(ARRAY['anon@own.example'])),
    '(ok,1,1)', 'catch-all: its fault does not refuse mail for an inbox of the domain another owner has'
);
SELECT is(
    mailroom.inbox_fault('c@own.example', NULL, 'api', 'owner-a') ->> 'scope', 'catchall_domain',
    'inbox_fault: the domain''s fault is shown for owner A''s inbox of it'
);
SELECT is(
    mailroom_internal._fault_json(m.id, m.address, 'own.example'), NULL,
    'and not for the inbox of the domain another owner has (it is not in force there)'
)
FROM mailroom.mailboxes AS m WHERE m.address = 'anon@own.example';
SELECT ok(mailroom.remove_catchall_domain('own.example'), 'owner A''s catch-all domain removed');

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
