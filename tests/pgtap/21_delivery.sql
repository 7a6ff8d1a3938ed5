-- Delivery guard at the exact expiry boundary, plan limits, list/read and their errors.
BEGIN;
SELECT plan(94);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
-- the count limit's refusal is tested on the free plan: pinned to refuse here (its seeded when_full is
-- drop_oldest, migration 0500; an installation may choose either); drop_oldest is tested at the end
UPDATE mailroom.plans SET when_full = 'refuse' WHERE name = 'free';

CREATE TEMP TABLE b AS
SELECT 'free' AS k, * FROM mailroom.create_mailbox(10, 'free');
INSERT INTO b SELECT 'free2', * FROM mailroom.create_mailbox(10, 'free');
INSERT INTO b SELECT 'pro', * FROM mailroom.create_mailbox(10, 'pro');

-- free expires at 2030-01-01 00:10:00+00. The guard is expires_at > clock.
SET LOCAL mailroom.clock = '2030-01-01 00:09:59.999999+00';
SELECT ok(mailroom.mailbox_accepts((SELECT address FROM b WHERE k = 'free')), 'accepts 1 us before expiry');
SELECT ok(
    mailroom.deliver_message((SELECT address FROM b WHERE k = 'free'), '\x4869'::bytea, 'a@example.com',
        '{"subject": "Hi", "from_header": "A <a@example.com>", "text_body": "text", "html_body": "<p>html</p>",
          "attachments": [{"filename": "x.txt"}]}'::jsonb) > 0,
    'delivers 1 us before expiry'
);
SELECT is(
    (SELECT received_at FROM mailroom.messages WHERE mailbox_id = (SELECT mailbox_id FROM b WHERE k = 'free')),
    '2030-01-01 00:09:59.999999+00'::timestamptz, 'received_at is mailroom.clock()'
);

SET LOCAL mailroom.clock = '2030-01-01 00:10:00+00';
SELECT ok(NOT mailroom.mailbox_accepts((SELECT address FROM b WHERE k = 'free')), 'refuses at expiry');
SELECT throws_ok(
    format('SELECT mailroom.deliver_message(%L, %L::bytea)', (SELECT address FROM b WHERE k = 'free'), '\x4869'),
    'MR205', 'mailbox expired', 'delivery at the exact expiry instant is refused'
);

SET LOCAL mailroom.clock = '2030-01-01 00:10:00.000001+00';
SELECT is((SELECT verdict FROM mailroom.check_recipient((SELECT address FROM b WHERE k = 'free'))), 'expired', 'refuses 1 us after expiry');
SELECT throws_ok(
    format('SELECT mailroom.deliver_message(%L, %L::bytea)', (SELECT address FROM b WHERE k = 'free'), '\x4869'),
    'MR205', 'mailbox expired', 'delivery after expiry is refused though the sweep has not run'
);
SELECT ok((SELECT is_active FROM mailroom.mailboxes WHERE id = (SELECT mailbox_id FROM b WHERE k = 'free')),
    'the mailbox is still flagged active: the guard alone refused it');
SELECT is((SELECT count(*) FROM mailroom.messages WHERE mailbox_id = (SELECT mailbox_id FROM b WHERE k = 'free')),
    1::bigint, 'only the message delivered before expiry is stored');
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)',
        (SELECT address FROM b WHERE k = 'free'), (SELECT session_token FROM b WHERE k = 'free')),
    'MR205', 'mailbox expired at 2030-01-01 00:10:00+00', 'listing an expired mailbox says expired (not an empty list)'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, %L, 1)',
        (SELECT address FROM b WHERE k = 'free'), (SELECT session_token FROM b WHERE k = 'free')),
    'MR205', 'mailbox expired at 2030-01-01 00:10:00+00', 'reading from an expired mailbox says expired'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)', (SELECT address FROM b WHERE k = 'free'), 'bad'),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)',
    'expiry is only revealed to an authorized caller'
);

SELECT throws_ok(
    format('SELECT mailroom.extend_mailbox(%L, %L, 10)',
        (SELECT address FROM b WHERE k = 'free'), (SELECT session_token FROM b WHERE k = 'free')),
    'MR205', 'mailbox expired at 2030-01-01 00:10:00+00', 'an expired mailbox cannot be extended'
);
SELECT is(
    mailroom.delete_mailbox((SELECT address FROM b WHERE k = 'free'), (SELECT session_token FROM b WHERE k = 'free')),
    true, 'an expired mailbox can still be deleted by its owner'
);
SELECT is(
    (SELECT inactive_since FROM mailroom.mailboxes WHERE id = (SELECT mailbox_id FROM b WHERE k = 'free')),
    '2030-01-01 00:10:00+00'::timestamptz, 'retention then counts from its expiry, not the later delete'
);

SET LOCAL mailroom.clock = '2030-01-01 00:01:00+00';
SELECT throws_ok($$SELECT mailroom.deliver_message('nobody@mailroom.test', '\x4869'::bytea)$$,
    'MR203', 'mailbox not found', 'unknown address');
SELECT throws_ok(format('SELECT mailroom.deliver_message(%L, %L::bytea)', (SELECT address FROM b WHERE k = 'pro'), ''),
    'MR211', 'message is empty', 'empty message');
SELECT throws_ok(format('SELECT mailroom.deliver_message(%L, NULL)', (SELECT address FROM b WHERE k = 'pro')),
    'MR211', 'message is empty', 'NULL message');
SELECT throws_ok(
    format('SELECT mailroom.deliver_message(%L, %L::bytea, %L, %L::jsonb)',
        (SELECT address FROM b WHERE k = 'pro'), '\x41', '', '{"attachments": {}}'),
    'MR211', 'attachments must be a JSON array of metadata objects', 'attachments must be an array'
);
SELECT throws_ok(
    format('SELECT mailroom.deliver_message(%L, %L::bytea, %L, %L::jsonb)',
        (SELECT address FROM b WHERE k = 'pro'), '\x41', '', '["Hi"]'),
    'MR211', 'the parsed message must be a JSON object', 'the parsed message is one JSON object'
);
SELECT throws_ok(
    format('SELECT mailroom.deliver_message(%L, %L::bytea, p_attachments => %L)',
        (SELECT address FROM b WHERE k = 'pro'), '\x41', '{}'),
    'MR211', 'attachments must be a JSON array of metadata objects',
    'the previous release''s form (deprecated): the same refusal'
);

-- Size limit per plan: free 2 MiB, pro 10 MiB.
SELECT throws_ok(
    format('SELECT mailroom.deliver_message(%L, convert_to(repeat(%L, 2097153), %L))',
        (SELECT address FROM b WHERE k = 'free2'), 'x', 'UTF8'),
    'MR207', 'message of 2097153 bytes exceeds the plan''s size limit', 'free plan refuses 2 MiB + 1'
);
SELECT ok(
    mailroom.deliver_message((SELECT address FROM b WHERE k = 'free2'), convert_to(repeat('x', 2097152), 'UTF8')) > 0,
    'free plan accepts exactly 2 MiB'
);
SELECT ok(
    mailroom.deliver_message((SELECT address FROM b WHERE k = 'pro'), convert_to(repeat('x', 2097153), 'UTF8')) > 0,
    'pro plan accepts 2 MiB + 1'
);
SELECT is((SELECT verdict FROM mailroom.check_recipient((SELECT address FROM b WHERE k = 'free2'), 2097153)), 'too_large',
    'RCPT check sees a declared SIZE over the plan limit');
SELECT is(mailroom.max_inbound_message_bytes(), 26214400, 'SIZE advertised is the largest plan limit');

-- Count limit: fill free2 up to 100 messages.
SELECT is(
    (SELECT count(mailroom.deliver_message((SELECT address FROM b WHERE k = 'free2'), '\x41'::bytea))
        FROM generate_series(1, 99)),
    99::bigint, 'free2 takes 99 more messages'
);
SELECT is((SELECT verdict FROM mailroom.check_recipient((SELECT address FROM b WHERE k = 'free2'))), 'full', 'a full mailbox is reported');
SELECT throws_ok(format('SELECT mailroom.deliver_message(%L, %L::bytea)', (SELECT address FROM b WHERE k = 'free2'), '\x41'),
    'MR208', 'mailbox is full (plan message limit reached)', 'the 101st message is refused');
SELECT is((SELECT message_count FROM mailroom.mailboxes WHERE id = (SELECT mailbox_id FROM b WHERE k = 'free2')),
    100, 'message_count matches');

-- List and read.
SET LOCAL mailroom.clock = '2030-01-01 00:02:00+00';
SELECT is(
    (SELECT count(*) FROM mailroom.list_messages(
        (SELECT address FROM b WHERE k = 'free2'), (SELECT session_token FROM b WHERE k = 'free2'))),
    100::bigint, 'list_messages returns up to 100 by default'
);
SELECT is(
    (SELECT count(*) FROM mailroom.list_messages(
        (SELECT address FROM b WHERE k = 'free2'), (SELECT session_token FROM b WHERE k = 'free2'),
        p_limit => 10, p_offset => 95)),
    5::bigint, 'list_messages pages with limit/offset'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L, p_limit => 0)',
        (SELECT address FROM b WHERE k = 'free2'), (SELECT session_token FROM b WHERE k = 'free2')),
    '22023', 'p_limit must be positive and p_offset non-negative', 'bad paging is refused'
);

-- the previous release's form (a deprecated wrapper of the p_parsed form): the same message stored
CREATE TEMP TABLE m AS
SELECT mailroom.deliver_message((SELECT address FROM b WHERE k = 'pro'), '\x53756269'::bytea, 'sender@example.org',
    'Subject line', 'S <sender@example.org>', 'the text', '<b>the html</b>',
    '[{"filename": "a.pdf", "content_type": "application/pdf", "size": 3, "content_id": null, "sha256": "ab"}]')
    AS id;
SELECT results_eq(
    format('SELECT message_id, envelope_from, subject, text_body, html_body, is_read FROM mailroom.list_messages(%L, %L)
            WHERE message_id = %s',
        (SELECT address FROM b WHERE k = 'pro'), (SELECT session_token FROM b WHERE k = 'pro'), (SELECT id FROM m)),
    format($$VALUES (%s::bigint, 'sender@example.org', 'Subject line', 'the text', '<b>the html</b>', false)$$,
        (SELECT id FROM m)),
    'list_messages returns the parsed fields, unread'
);
SELECT results_eq(
    format('SELECT raw, is_read, attachments->0->>''filename'' FROM mailroom.read_message(%L, %L, %s)',
        (SELECT address FROM b WHERE k = 'pro'), (SELECT session_token FROM b WHERE k = 'pro'), (SELECT id FROM m)),
    $$VALUES ('\x53756269'::bytea, true, 'a.pdf')$$,
    'read_message returns the raw bytes and marks the message read'
);
SELECT is((SELECT is_read FROM mailroom.messages WHERE id = (SELECT id FROM m)), true, 'is_read is stored');
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, %L, %s)',
        (SELECT address FROM b WHERE k = 'free2'), (SELECT session_token FROM b WHERE k = 'free2'), (SELECT id FROM m)),
    'MR209', format('message %s not found in this mailbox', (SELECT id FROM m)),
    'a message of another mailbox cannot be read'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, %L, %s)',
        (SELECT address FROM b WHERE k = 'pro'), (SELECT session_token FROM b WHERE k = 'free2'), (SELECT id FROM m)),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)',
    'another mailbox''s token cannot read it'
);
SELECT is(
    (SELECT envelope_to FROM mailroom.messages WHERE id = (SELECT id FROM m)),
    (SELECT address FROM b WHERE k = 'pro'), 'envelope recipient is stored'
);

-- The guard reads the statement's real time, not now() frozen at transaction start.
SET LOCAL mailroom.clock = '';
UPDATE mailroom.mailboxes SET expires_at = clock_timestamp() + interval '50 milliseconds'
WHERE id = (SELECT mailbox_id FROM b WHERE k = 'pro');
SELECT pg_sleep(0.1);
SELECT ok(
    now() < (SELECT expires_at FROM mailroom.mailboxes WHERE id = (SELECT mailbox_id FROM b WHERE k = 'pro')),
    'by transaction time (now()) the mailbox would still be open'
);
SELECT throws_ok(format('SELECT mailroom.deliver_message(%L, %L::bytea)', (SELECT address FROM b WHERE k = 'pro'), '\x41'),
    'MR205', 'mailbox expired', 'but by the statement''s real time it has expired: refused');

-- deliver_messages: the DATA step, several messages in one statement, each message's data given
-- once, each message stored for all its recipients or for none, with its verdict and SMTP reply
SET LOCAL mailroom.clock = '2030-02-01 00:00:00+00';
INSERT INTO b SELECT 'g1', * FROM mailroom.create_mailbox(10, 'free');
INSERT INTO b SELECT 'g2', * FROM mailroom.create_mailbox(10, 'free');
INSERT INTO b SELECT 'gp', * FROM mailroom.create_mailbox(10, 'pro');
CREATE TEMP TABLE g AS
SELECT * FROM mailroom.deliver_messages(
    ARRAY[1, 2, 2, 3],
    ARRAY[(SELECT address FROM b WHERE k = 'g1'), (SELECT address FROM b WHERE k = 'g1'),
        (SELECT address FROM b WHERE k = 'g2'), 'nobody@mailroom.test'],
    ARRAY['\x41'::bytea, '\x4242'::bytea, '\x43'::bytea], ARRAY['a@example.com', '', ''],
    ARRAY[
        '{"subject": "one", "text_body": "t1", "attachments": []}',
        '{"subject": "two", "from_header": "B <b@example.com>", "html_body": "<p>2</p>",
          "attachments": [{"filename": "b.txt"}], "defects": 0}',
        '{"subject": "three"}'
    ]::jsonb[]
);
SELECT results_eq(
    'SELECT message, cardinality(message_ids), verdict, reply FROM g ORDER BY message',
    $$VALUES (1, 1, 'ok', '250 2.0.0 OK: stored for 1 recipient(s)'), (2, 2, 'ok', '250 2.0.0 OK: stored for 2 recipient(s)'),
        (3, 0, 'unknown', '550 5.1.1 Mailbox unavailable (unknown, deleted or expired)')$$,
    'deliver_messages: one row per message, its verdict and the SMTP reply; a refused message does not fail the others'
);
SELECT is(
    (SELECT array_agg(m.subject || ':' || octet_length(m.raw) ORDER BY m.id) FROM mailroom.messages AS m
     WHERE m.id IN (SELECT unnest(message_ids) FROM g)),
    ARRAY['one:1', 'two:2', 'two:2'], 'each recipient got its own message''s data'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.messages AS m
     WHERE m.mailbox_id = (SELECT mailbox_id FROM b WHERE k = 'g2') AND m.from_header = 'B <b@example.com>'
         AND m.html_body = '<p>2</p>' AND m.attachments = '[{"filename": "b.txt"}]'),
    1, 'every column of the second message reached its second recipient'
);
-- all or nothing for one message: g1 takes it, the pro-sized message is too large for g2
UPDATE mailroom.mailboxes SET message_count = (SELECT max_messages FROM mailroom.plans WHERE name = 'free')
WHERE id = (SELECT mailbox_id FROM b WHERE k = 'g2');
SELECT results_eq(
    format(
        'SELECT verdict, reply, message_ids FROM mailroom.deliver_messages(ARRAY[1, 1], ARRAY[%L, %L],'
        ' ARRAY[''\x41''::bytea], ARRAY[''''], ARRAY[''{}'']::jsonb[])',
        (SELECT address FROM b WHERE k = 'g1'), (SELECT address FROM b WHERE k = 'g2')
    ),
    $$VALUES ('retry'::text, '451 4.2.0 A recipient became unavailable; please try again'::text, '{}'::bigint[])$$,
    'one recipient full, another would take it: 451 4.2.0 (RCPT refuses the full one on the retry)'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.messages WHERE mailbox_id = (SELECT mailbox_id FROM b WHERE k = 'g1')),
    2, 'and nothing of the refused message was kept'
);
SELECT results_eq(
    format(
        'SELECT verdict, reply FROM mailroom.deliver_messages(ARRAY[1, 1], ARRAY[%L, %L],'
        ' ARRAY[%L::bytea], ARRAY[''''], ARRAY[''{}'']::jsonb[])',
        (SELECT address FROM b WHERE k = 'g1'), (SELECT address FROM b WHERE k = 'gp'),
        '\x' || repeat('41', (SELECT max_message_bytes + 1 FROM mailroom.plans WHERE name = 'free'))
    ),
    $$VALUES ('too_large'::text, '552 5.3.4 Message too big for this mailbox'::text)$$,
    'too large for one recipient (only DATA knows): the refusal stands, 552 5.3.4'
);
SELECT results_eq(
    format(
        'SELECT verdict, reply FROM mailroom.deliver_messages(ARRAY[1], ARRAY[%L], ARRAY[''\x200d0a''::bytea],'
        ' ARRAY[''''], ARRAY[''{}'']::jsonb[])',
        (SELECT address FROM b WHERE k = 'gp')
    ),
    $$VALUES ('MR211'::text, '554 5.6.0 Message is empty'::text)$$,
    'a message of white space only is empty: 554 5.6.0'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.deliver_messages(ARRAY[2], ARRAY['a@b.c'], ARRAY['\x41'::bytea], ARRAY[''],
        ARRAY['{}']::jsonb[])$$,
    'MR216', NULL, 'a recipient of no message: MR216'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.deliver_messages(ARRAY[1], ARRAY['a@b.c'], ARRAY['\x41'::bytea], ARRAY['', ''],
        ARRAY['{}']::jsonb[])$$,
    'MR216', NULL, 'message arrays of different lengths: MR216'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.deliver_messages(ARRAY[1], ARRAY['a@b.c'], ARRAY['\x41'::bytea], ARRAY[''],
        ARRAY['{}', '{}']::jsonb[])$$,
    'MR216', NULL, 'a parsed document per message: MR216'
);
-- the previous release's form (deprecated): one array per parsed field, checked and stored the same
SELECT throws_ok(
    $$SELECT * FROM mailroom.deliver_messages(ARRAY[1], ARRAY['a@b.c'], ARRAY['\x41'::bytea], ARRAY[''],
        ARRAY['x', 'y'], ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY['[]']::jsonb[])$$,
    'MR216', NULL, 'the previous release''s form: its field arrays of one length, MR216'
);
CREATE TEMP TABLE old_form AS
SELECT * FROM mailroom.deliver_messages(ARRAY[1], ARRAY[(SELECT address FROM b WHERE k = 'gp')], ARRAY['\x45'::bytea],
    ARRAY['old@example.com'], ARRAY['old form'], ARRAY['O <old@example.com>'], ARRAY['t'], ARRAY['<i>h</i>'],
    ARRAY['[{"filename": "o.txt"}]']::jsonb[]);
SELECT is(
    (SELECT row(m.subject, m.from_header, m.text_body, m.html_body, m.attachments)::text
     FROM old_form AS d JOIN mailroom.messages AS m ON m.id = d.message_ids[1]),
    row('old form', 'O <old@example.com>', 't', '<i>h</i>', '[{"filename": "o.txt"}]'::jsonb)::text,
    'the previous release''s form stores every field as the p_parsed form does'
);

-- check_message_size: the DATA-stage probe
SELECT results_eq(
    format('SELECT verdict, address, reply FROM mailroom.check_message_size(ARRAY[%L, %L], %s)',
        (SELECT address FROM b WHERE k = 'g1'), (SELECT address FROM b WHERE k = 'gp'),
        (SELECT max_message_bytes + 1 FROM mailroom.plans WHERE name = 'free')),
    format($$VALUES ('ok'::text, %L::text, NULL::text)$$, (SELECT address FROM b WHERE k = 'gp')),
    'over the free plan: the pro recipient takes it'
);
SELECT results_eq(
    format('SELECT verdict, address, reply FROM mailroom.check_message_size(ARRAY[%L, %L], 10)',
        (SELECT upper(address) FROM b WHERE k = 'gp'), (SELECT address FROM b WHERE k = 'g1')),
    format($$VALUES ('ok'::text, %L::text, NULL::text)$$, (SELECT address FROM b WHERE k = 'gp')),
    'the first recipient that takes it, in its normalized form'
);
SELECT results_eq(
    format('SELECT verdict, address, reply FROM mailroom.check_message_size(ARRAY[%L, %L], %s)',
        (SELECT address FROM b WHERE k = 'g1'), (SELECT address FROM b WHERE k = 'g2'),
        (SELECT max_message_bytes + 1 FROM mailroom.plans WHERE name = 'free')),
    $$VALUES ('too_large'::text, NULL::text, '552 5.3.4 Message too big for this mailbox'::text)$$,
    'over every recipient''s plan: too_large, with the SMTP reply'
);

-- delivery receipts (issue 34): an answer lost after the statement was sent is settled by its key
SET LOCAL mailroom.clock = '2030-02-02 00:00:00+00';
INSERT INTO b SELECT 'rc', * FROM mailroom.create_mailbox(600, 'free');
SELECT mailroom.set_delivery_receipt('00000000-0000-7000-8000-000000000001');
CREATE TEMP TABLE rc AS
SELECT * FROM mailroom.deliver_messages(
    ARRAY[1, 2], ARRAY[(SELECT address FROM b WHERE k = 'rc'), 'nobody@mailroom.test'],
    ARRAY['\x41'::bytea, '\x42'::bytea], ARRAY['', ''], ARRAY['{"subject": "r1"}', '{"subject": "r2"}']::jsonb[]
);
SELECT is(
    (SELECT replies FROM mailroom.delivery_receipts WHERE key = '00000000-0000-7000-8000-000000000001'),
    (SELECT array_agg(reply ORDER BY message) FROM rc),
    'deliver_messages leaves the receipt set_delivery_receipt asked for: its replies in message order'
);
SELECT is(
    mailroom.settle_delivery('00000000-0000-7000-8000-000000000001'),
    ARRAY['250 2.0.0 OK: stored for 1 recipient(s)', '550 5.1.1 Mailbox unavailable (unknown, deleted or expired)'],
    'settle_delivery answers what was decided under the key'
);
SELECT is(
    mailroom.settle_delivery('00000000-0000-7000-8000-000000000002'), NULL,
    'settle_delivery of a key nothing was delivered under: NULL'
);
SELECT is(
    (SELECT replies IS NULL FROM mailroom.delivery_receipts WHERE key = '00000000-0000-7000-8000-000000000002'),
    true, 'and it leaves a tombstone under the key'
);
SELECT mailroom.set_delivery_receipt('00000000-0000-7000-8000-000000000002');
SELECT throws_ok(
    format(
        'SELECT * FROM mailroom.deliver_messages(ARRAY[1], ARRAY[%L], ARRAY[''\x43''::bytea], ARRAY[''''],'
        ' ARRAY[''{"subject": "late"}''::jsonb])',
        (SELECT address FROM b WHERE k = 'rc')
    ),
    '23505', NULL, 'a delivery under a settled key cannot commit: the settled answer is final'
);
SELECT set_config('mailroom.delivery_receipt', '', true);  -- the failed statement's rollback kept it
SELECT is(
    (SELECT count(*)::int FROM mailroom.messages WHERE subject = 'late'), 0, 'and nothing of it is stored'
);
SELECT is(
    mailroom.settle_delivery('00000000-0000-7000-8000-000000000002'), NULL, 'a tombstone settles as nothing delivered'
);
SELECT lives_ok(
    format(
        'SELECT * FROM mailroom.deliver_messages(ARRAY[1], ARRAY[%L], ARRAY[''\x44''::bytea], ARRAY[''''],'
        ' ARRAY[''{"subject": "plain"}''::jsonb])',
        (SELECT address FROM b WHERE k = 'rc')
    ),
    'one receipt per key: the next deliver_messages of the transaction asks for none'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.delivery_receipts
     WHERE key::text IN ('00000000-0000-7000-8000-000000000001', '00000000-0000-7000-8000-000000000002')), 2,
    'so it leaves none'
);
-- the key as an argument (issue 37): the inbound server's DATA step is one autocommit statement
CREATE TEMP TABLE rc3 AS
SELECT * FROM mailroom.deliver_messages(
    p_message => ARRAY[1], p_address => ARRAY[(SELECT address FROM b WHERE k = 'rc')], p_raw => ARRAY['\x45'::bytea],
    p_envelope_from => ARRAY[''], p_parsed => ARRAY['{"subject": "keyed"}']::jsonb[],
    p_receipt => '00000000-0000-7000-8000-000000000003'
);
SELECT is(
    mailroom.settle_delivery('00000000-0000-7000-8000-000000000003'),
    ARRAY['250 2.0.0 OK: stored for 1 recipient(s)'],
    'deliver_messages with p_receipt leaves the receipt itself: settle_delivery finds its replies'
);
SELECT throws_ok(
    format(
        'SELECT * FROM mailroom.deliver_messages(ARRAY[1], ARRAY[%L], ARRAY[''\x46''::bytea], ARRAY[''''],'
        ' ARRAY[''{"subject": "late2"}''::jsonb], ''00000000-0000-7000-8000-000000000002'')',
        (SELECT address FROM b WHERE k = 'rc')
    ),
    '23505', NULL, 'a delivery passing a settled key cannot commit either'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.messages WHERE subject IN ('late2', 'keyed')), 1,
    'nothing of it is stored; the keyed one is'
);
SELECT throws_ok('SELECT mailroom.settle_delivery(NULL)', 'MR217', NULL, 'settle_delivery needs a key');
SELECT throws_ok('SELECT mailroom.set_delivery_receipt(NULL)', 'MR217', NULL, 'set_delivery_receipt needs a key');
SELECT ok(
    has_function_privilege('mailroom_inbound', 'mailroom.settle_delivery(uuid)', 'EXECUTE')
    AND has_function_privilege('mailroom_inbound', 'mailroom.set_delivery_receipt(uuid)', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_http', 'mailroom.settle_delivery(uuid)', 'EXECUTE'),
    'the inbound server, and only it, settles its deliveries'
);

-- a plan that lets the oldest go when full (plans.when_full drop_oldest, migration 0475): any plan may
SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
UPDATE mailroom.plans SET max_messages = 2, when_full = 'drop_oldest' WHERE name = 'enterprise';
CREATE TEMP TABLE ring AS SELECT * FROM mailroom.create_mailbox(10, 'enterprise');
SELECT lives_ok(
    $$SELECT mailroom.deliver_message((SELECT address FROM ring), convert_to('m' || n, 'UTF8'), 'a@example.com', '{}')
      FROM generate_series(1, 4) AS n$$,
    'four messages into a drop_oldest inbox of two places'
);
SELECT is(
    (SELECT array_agg(convert_from(raw, 'UTF8') ORDER BY id)::text FROM mailroom.messages
     WHERE mailbox_id = (SELECT mailbox_id FROM ring)),
    '{m3,m4}', 'the oldest two went'
);
SELECT is(
    (SELECT row(message_count, stored_bytes)::text FROM mailroom.mailboxes WHERE id = (SELECT mailbox_id FROM ring)),
    '(2,4)', 'count and bytes of the two kept'
);
UPDATE mailroom.plans SET when_full = 'refuse' WHERE name = 'enterprise';
SELECT throws_ok(
    format('SELECT mailroom.deliver_message(%L, %L::bytea)', (SELECT address FROM ring), '\x4869'),
    'MR208', NULL, 'the same inbox under refuse: full (MR208)'
);

-- a plan's count lowered under its inboxes: each delivery lets at most 10 go (bounded work per
-- delivery), so the inbox comes back under its count over a few deliveries, never in one long one
UPDATE mailroom.plans SET max_messages = 30, when_full = 'drop_oldest' WHERE name = 'enterprise';
SELECT lives_ok(
    $$SELECT mailroom.deliver_message((SELECT address FROM ring), convert_to('n' || n, 'UTF8'), 'a@example.com', '{}')
      FROM generate_series(1, 20) AS n$$,
    'twenty more into the ring, now of thirty places'
);
UPDATE mailroom.plans SET max_messages = 2 WHERE name = 'enterprise';
SELECT lives_ok(
    format('SELECT mailroom.deliver_message(%L, %L::bytea)', (SELECT address FROM ring), '\x4869'),
    'one more after the plan went down to two places'
);
SELECT is(
    (SELECT message_count FROM mailroom.mailboxes WHERE id = (SELECT mailbox_id FROM ring)),
    13, 'twenty-three held, ten let go by that one delivery'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.messages WHERE mailbox_id = (SELECT mailbox_id FROM ring)),
    13, 'the count is the messages'' count'
);

-- the free plan letting the oldest go (its seeded default): the 101st message of a full free inbox is
-- stored in the same transaction as its oldest goes, the inbox stays at 100
UPDATE mailroom.plans SET when_full = 'drop_oldest' WHERE name = 'free';
SELECT is(
    (SELECT verdict FROM mailroom.check_recipient((SELECT address FROM b WHERE k = 'free2'))), 'ok',
    'a full free inbox that lets the oldest go is not full at RCPT'
);
CREATE TEMP TABLE oldest AS
SELECT min(id) AS id, max(id) AS newest, count(*) AS n
FROM mailroom.messages WHERE mailbox_id = (SELECT mailbox_id FROM b WHERE k = 'free2');
SELECT is((SELECT n FROM oldest), 100::bigint, 'free2 is full');
CREATE TEMP TABLE newest AS
SELECT mailroom.deliver_message((SELECT address FROM b WHERE k = 'free2'), '\x4869'::bytea) AS id;
SELECT ok(
    (SELECT id FROM newest) > (SELECT newest FROM oldest)
    AND (SELECT message_count FROM mailroom.mailboxes WHERE id = (SELECT mailbox_id FROM b WHERE k = 'free2')) = 100
    AND NOT EXISTS (SELECT 1 FROM mailroom.messages WHERE id = (SELECT id FROM oldest))
    AND (SELECT count(*) FROM mailroom.messages WHERE mailbox_id = (SELECT mailbox_id FROM b WHERE k = 'free2')) = 100,
    'the 101st message is stored, its oldest gone, 100 kept'
);

-- The Received: header of mail stored over SMTP (issue 44): deliver_messages writes it from
-- the parsed document's trace (the SMTP session's facts), dated by mailroom.clock(), one per message.
SET LOCAL mailroom.clock = '2031-02-03 04:05:06+00';
INSERT INTO mailroom.plans (name, default_ttl_minutes, max_ttl_minutes, max_message_bytes, max_messages)
VALUES ('pgtap_tiny', 10, 10, 100, 10);
CREATE TEMP TABLE rb AS
SELECT 'one' AS k, * FROM mailroom.create_mailbox(10, 'pro');
INSERT INTO rb SELECT 'two', * FROM mailroom.create_mailbox(10, 'pro');
INSERT INTO rb SELECT 'tiny', * FROM mailroom.create_mailbox(10, 'pgtap_tiny');
CREATE TEMP TABLE rt AS SELECT
    '{"client": "192.0.2.7", "helo": "mx.example.org", "by": "in.mailroom.test", "esmtp": true, "tls": true,
      "auth": false}'::jsonb AS trace;

SELECT is(
    (SELECT row(d.verdict, cardinality(d.message_ids))::text FROM mailroom.deliver_messages(
        ARRAY[1], ARRAY[(SELECT address FROM rb WHERE k = 'one')], ARRAY[convert_to(E'Subject: t\r\n\r\nbody\r\n', 'UTF8')],
        ARRAY['a@example.com'], ARRAY[jsonb_build_object('subject', 't', 'trace', (SELECT trace FROM rt))]) AS d),
    '(ok,1)', 'a message with its session''s trace is stored'
);
SELECT is(
    (SELECT regexp_replace(convert_from(raw, 'UTF8'), ' id [0-9A-F]{12}', ' id X') FROM mailroom.messages
     WHERE mailbox_id = (SELECT mailbox_id FROM rb WHERE k = 'one')),
    E'Received: from mx.example.org ([192.0.2.7])\r\n\tby in.mailroom.test (mailroom) with ESMTPS id X\r\n\tfor <'
    || (SELECT address FROM rb WHERE k = 'one') || E'>; Mon, 03 Feb 2031 04:05:06 +0000\r\nSubject: t\r\n\r\nbody\r\n',
    'one Received: header in front: client literal, HELO, server, protocol, id, for <the one recipient>, the clock''s date'
);
SELECT is(
    (SELECT size_bytes::bigint FROM mailroom.messages WHERE mailbox_id = (SELECT mailbox_id FROM rb WHERE k = 'one')),
    (SELECT octet_length(raw)::bigint FROM mailroom.messages WHERE mailbox_id = (SELECT mailbox_id FROM rb WHERE k = 'one')),
    'size_bytes is the size stored, the header included'
);

SELECT is(
    (SELECT d.verdict FROM mailroom.deliver_messages(
        ARRAY[1, 1], ARRAY[(SELECT address FROM rb WHERE k = 'one'), (SELECT address FROM rb WHERE k = 'two')],
        ARRAY[convert_to(E'Subject: both\r\n\r\nx\r\n', 'UTF8')], ARRAY[''],
        ARRAY[jsonb_build_object('trace', jsonb_build_object(
            'client', '::1', 'helo', E'evil\r\nX-Injected: yes\rZ', 'by', 'in.mailroom.test')
        )]) AS d),
    'ok', 'a message for two recipients, with a HELO holding CR and LF'
);
SELECT is(
    (SELECT count(DISTINCT raw) FROM mailroom.messages WHERE mailbox_id IN (
        SELECT mailbox_id FROM rb WHERE k IN ('one', 'two'))
        AND convert_from(raw, 'UTF8') LIKE '%Subject: both%'),
    1::bigint, 'its two copies are alike (one header per message)'
);
SELECT is(
    (SELECT regexp_replace(convert_from(raw, 'UTF8'), ' id [0-9A-F]{12}', ' id X') FROM mailroom.messages
     WHERE mailbox_id = (SELECT mailbox_id FROM rb WHERE k = 'two')),
    E'Received: from evil??X-Injected:?yes?Z ([IPv6:::1])\r\n\tby in.mailroom.test (mailroom) with SMTP id X;\r\n\t'
    || E'Mon, 03 Feb 2031 04:05:06 +0000\r\nSubject: both\r\n\r\nx\r\n',
    'no for <...> with two recipients; the HELO''s CR, LF and space written ?, so no line of the client''s own'
);
SELECT matches(
    mailroom_internal._received_header(
        jsonb_build_object('client', 'not an address', 'helo', repeat('h', 300), 'esmtp', true, 'tls', true,
            'auth', true, 'smtputf8', true),
        E'a\r\nb<c>@x.test', now()),
    E'^Received: from h{255} \\(unknown\\)\r\n\tby unknown \\(mailroom\\) with UTF8SMTPSA id [0-9A-F]{12}\r\n\tfor <a\\?\\?b\\?c\\?@x\\.test>; ',
    'UTF8SMTPSA (RFC 6531); a HELO bounded to 255; no client literal: unknown; controls and brackets of a recipient written ?'
);

-- the plan's size limit bounds what the client sent: the header is not counted against it
SELECT is(
    (SELECT row(d.verdict, cardinality(d.message_ids))::text FROM mailroom.deliver_messages(
        ARRAY[1], ARRAY[(SELECT address FROM rb WHERE k = 'tiny')],
        ARRAY[convert_to(E'Subject: s\r\n\r\n' || repeat('a', 100 - 16) || E'\r\n', 'UTF8')],
        ARRAY[''], ARRAY[jsonb_build_object('trace', (SELECT trace FROM rt))]) AS d),
    '(ok,1)', 'a message of exactly the plan''s size is stored with its header'
);
SELECT ok(
    (SELECT size_bytes > 100 FROM mailroom.messages WHERE mailbox_id = (SELECT mailbox_id FROM rb WHERE k = 'tiny')),
    'and stored larger than the plan''s size (size_bytes counts the header)'
);
SELECT is(
    (SELECT d.verdict FROM mailroom.deliver_messages(
        ARRAY[1], ARRAY[(SELECT address FROM rb WHERE k = 'tiny')],
        ARRAY[convert_to(E'Subject: s\r\n\r\n' || repeat('a', 101 - 16) || E'\r\n', 'UTF8')],
        ARRAY[''], ARRAY[jsonb_build_object('trace', (SELECT trace FROM rt))]) AS d),
    'too_large', 'one byte more from the client is too large'
);
SELECT throws_ok(
    format('SELECT mailroom.deliver_message(%L, %L::bytea, %L, %L::jsonb, %L)', (SELECT address FROM rb WHERE k = 'one'),
        '\x4869', '', '{}', E'Received: x\r\nX-Injected: y\n'),
    'MR285', NULL, 'deliver_message refuses a trace that is not CRLF-terminated header lines'
);
SELECT ok(
    mailroom.deliver_message((SELECT address FROM rb WHERE k = 'one'), '\x4869'::bytea, '', '{}'::jsonb,
        E'Received: from a (b)\r\n\tby c; d\r\n') > 0,
    'and stores one that is, in front of the message'
);

SELECT * FROM finish();
ROLLBACK;
