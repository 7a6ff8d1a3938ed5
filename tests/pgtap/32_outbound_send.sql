-- Outbound: send over HTTP (http_send_message; grant_api_key_sender, revoke_api_key_sender,
-- list_api_key_senders): a key sends only through a sender granted to it (MR374, the same for an
-- unknown sender), only to send.allowed_recipients (empty by default: none, MR021), at most
-- send.max_recipients (MR377), within send.rate_per_key (MR020); a line break in any header value is
-- MR376, a field it does not know MR375; the queued row (sender, recipients, subject, bodies,
-- Reply-To, attachments mapped from Mailpit's shape); one audit line a send, none for a replay of
-- the same Idempotency-Key, which answers the same ID.
BEGIN;
SELECT plan(48);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:10+00';
SELECT mailroom.upsert_sender('send-relay', 'robot@send.example', '127.0.0.1', 2525);
SELECT mailroom.upsert_sender('send-other', 'other@send.example', '127.0.0.1', 2526);
CREATE TEMP TABLE keys AS SELECT
    mailroom.create_api_key('send-team', sha256('mrk_send_one'::bytea)) AS one,
    mailroom.create_api_key('send-team', sha256('mrk_send_two'::bytea)) AS two;
CREATE FUNCTION pg_temp.send(p_doc jsonb, p_key text DEFAULT 'mrk_send_one', p_idem text DEFAULT null)
RETURNS jsonb LANGUAGE sql AS $$
    SELECT mailroom.http_send_message(sha256(convert_to(p_key, 'UTF8')), p_doc, p_idem)
$$;
CREATE FUNCTION pg_temp.audits() RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM mailroom.audit_log WHERE action = 'send' AND key_id = (SELECT one FROM keys)
$$;
CREATE TEMP TABLE plain AS SELECT
    '{"From": {"Email": "robot@send.example", "Name": "Robot"}, "To": [{"Email": "qa@allowed.example", "Name": "QA"}],
      "Subject": "Hello", "Text": "Hi there"}'::jsonb AS doc;

-- credentials and the grant
SELECT is((SELECT value || ' ' || kind FROM mailroom.settings WHERE name = 'send.rate_per_key'), '60/h rate',
    'send.rate_per_key: 60 an hour by default');
SELECT throws_ok($$SELECT mailroom.http_send_message(null, (SELECT doc FROM plain))$$, 'MR240', NULL, 'no key: MR240');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain), 'mrk_unknown')$$, 'MR241', NULL, 'an unknown key: MR241');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain))$$, 'MR374', NULL, 'a key without a grant: MR374');
SELECT throws_ok($$SELECT pg_temp.send('{"Sender": "send-relay", "Tags": ["x"]}')$$, 'MR374', NULL,
    'without a grant MR374 comes first, before the shape');
SELECT is(mailroom.grant_api_key_sender((SELECT one FROM keys), 'send-relay'), true, 'granted');
SELECT is(mailroom.grant_api_key_sender((SELECT one FROM keys), 'send-relay'), false, 'granted again: false');
SELECT throws_ok($$SELECT mailroom.grant_api_key_sender(-1, 'send-relay')$$, 'MR378', NULL, 'no such key: MR378');
SELECT throws_ok($$SELECT mailroom.grant_api_key_sender((SELECT one FROM keys), 'nope')$$, 'MR301', NULL,
    'no such sender: MR301');
SELECT is((SELECT array_agg(sender || ' ' || from_address) FROM mailroom.list_api_key_senders((SELECT one FROM keys))),
    ARRAY['send-relay robot@send.example'], 'the grants of a key');

-- the allow-list: empty allows none
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain))$$, 'MR021', NULL,
    'send.allowed_recipients empty by default: MR021');
SELECT mailroom.set_setting('send.allowed_recipients', '*@allowed.example');
SELECT throws_ok(
    $$SELECT pg_temp.send((SELECT doc FROM plain) || '{"Bcc": ["spy@elsewhere.example"]}')$$, 'MR021', NULL,
    'a Bcc outside the list: MR021'
);
SELECT is(pg_temp.audits(), 0::bigint, 'no audit line for a refusal');

-- a send
CREATE TEMP TABLE s1 AS SELECT pg_temp.send((SELECT doc FROM plain) || '{
    "Cc": [{"Email": "cc@allowed.example"}], "Bcc": ["bcc@allowed.example"], "HTML": "<p>Hi</p>",
    "ReplyTo": [{"Email": "help@send.example", "Name": "Help"}], "Headers": {"X-Campaign": "spring"},
    "Attachments": [{"Content": "aGVsbG8=", "Filename": "a.txt", "ContentType": "text/plain"},
                    {"Content": "data:image/png;base64,AAEC", "Filename": "b.bin"}]}') AS doc;
SELECT is((SELECT doc ->> 'ID' FROM s1), (SELECT doc ->> 'outbound_id' FROM s1), 'ID: the outbound id, as text');
SELECT is((SELECT doc ->> 'sender' FROM s1), 'send-relay', 'through the granted sender of From.Email');
CREATE TEMP TABLE q AS SELECT m.* FROM mailroom.outbound_messages AS m WHERE m.id = (SELECT (doc ->> 'outbound_id')::bigint FROM s1);
SELECT is((SELECT message_id FROM q), (SELECT doc ->> 'message_id' FROM s1), 'the Message-ID answered');
SELECT is((SELECT ARRAY[to_addrs, cc_addrs, bcc_addrs] FROM q),
    ARRAY[ARRAY['qa@allowed.example'], ARRAY['cc@allowed.example'], ARRAY['bcc@allowed.example']], 'To, Cc, Bcc');
SELECT is((SELECT ARRAY[subject, text_body, html_body] FROM q), ARRAY['Hello', 'Hi there', '<p>Hi</p>'],
    'subject and bodies');
SELECT is((SELECT headers FROM q), '{"X-Campaign": "spring", "Reply-To": "help@send.example"}'::jsonb,
    'the extra headers and ReplyTo as Reply-To');
SELECT is(
    (SELECT array_agg(a.name || ' ' || a.content_type || ' ' || encode(a.content, 'hex') ORDER BY a.name)
     FROM q, unnest(q.attachments) AS a),
    ARRAY['a.txt text/plain 68656c6c6f', 'b.bin application/octet-stream 000102'],
    'attachments: Mailpit''s fields, a data: prefix dropped, no ContentType application/octet-stream'
);
SELECT is((SELECT status::text FROM q), 'queued', 'queued for the sender');
SELECT is(
    (SELECT to_jsonb(a) - 'id' - 'at' FROM mailroom.audit_log AS a WHERE a.outbound_id = (SELECT id FROM q)),
    jsonb_build_object('action', 'send', 'key_id', (SELECT one FROM keys), 'owner_type', 'api', 'owner_id', 'send-team',
        'mailbox_id', null, 'message_id', null, 'outbound_id', (SELECT id FROM q), 'recipients', 3),
    'one audit line: the key, the outbound id, three recipients (no address)'
);

-- the sender: by name, by From, the only one
SELECT is(pg_temp.send('{"To": ["qa@allowed.example"], "Text": "x"}') ->> 'sender', 'send-relay',
    'neither Sender nor From: the key''s only sender');
SELECT throws_ok($$SELECT pg_temp.send('{"Sender": "send-other", "To": ["qa@allowed.example"], "Text": "x"}')$$,
    'MR374', NULL, 'a sender not granted: MR374');
SELECT throws_ok($$SELECT pg_temp.send('{"Sender": "no-such", "To": ["qa@allowed.example"], "Text": "x"}')$$,
    'MR374', NULL, 'a sender that does not exist: MR374 too');
SELECT throws_ok($$SELECT pg_temp.send('{"From": "other@send.example", "To": ["qa@allowed.example"], "Text": "x"}')$$,
    'MR374', NULL, 'a From no granted sender has: MR374');
SELECT mailroom.grant_api_key_sender((SELECT one FROM keys), 'send-other');
SELECT throws_ok($$SELECT pg_temp.send('{"To": ["qa@allowed.example"], "Text": "x"}')$$, 'MR375', NULL,
    'two senders granted, none named: MR375');
SELECT is(pg_temp.send('{"From": {"Email": "Other@Send.example"}, "To": ["qa@allowed.example"], "Text": "x"}') ->> 'sender',
    'send-other', 'From.Email picks the sender (case-insensitive)');
SELECT throws_ok(
    $$SELECT pg_temp.send('{"Sender": "send-relay", "From": "other@send.example", "To": ["qa@allowed.example"], "Text": "x"}')$$,
    'MR375', NULL, 'a From that is not the named sender''s: MR375'
);
SELECT is(mailroom.revoke_api_key_sender((SELECT one FROM keys), 'send-other'), true, 'revoked');
SELECT is(mailroom.revoke_api_key_sender((SELECT one FROM keys), 'send-other'), false, 'revoked again: false');
SELECT throws_ok($$SELECT pg_temp.send('{"Sender": "send-other", "To": ["qa@allowed.example"], "Text": "x"}')$$,
    'MR374', NULL, 'after the revoke: MR374');

-- header injection and the shape
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain) || jsonb_build_object('Subject', E'Hi\r\nBcc: x@evil.example'))$$,
    'MR376', NULL, 'CR LF in the Subject: MR376');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain) || jsonb_build_object('To', jsonb_build_array(
    jsonb_build_object('Email', 'qa@allowed.example', 'Name', E'QA\nBcc: x@evil.example'))))$$,
    'MR376', NULL, 'a line break in a To Name: MR376');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain) || jsonb_build_object('From',
    jsonb_build_object('Email', 'robot@send.example', 'Name', E'R\rX')))$$, 'MR376', NULL, 'in the From Name: MR376');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain) || jsonb_build_object('Headers',
    jsonb_build_object('X-A', E'a\u2028b')))$$, 'MR376', NULL, 'a line separator in a header value: MR376');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain) || '{"Tags": ["a"]}')$$, 'MR375', NULL,
    'a field it does not know (Mailpit''s Tags): MR375');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain) || '{"Attachments": [{"Content": "AA==", "Filename": "i.png", "ContentID": "i1"}]}')$$,
    'MR375', NULL, 'an inline attachment: MR375');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain) || '{"To": "qa@allowed.example"}')$$, 'MR375', NULL,
    'To not an array: MR375');
SELECT throws_ok($$SELECT pg_temp.send('[1]')$$, 'MR375', NULL, 'not an object: MR375');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain) || '{"ReplyTo": ["not an address"]}')$$, 'MR375', NULL,
    'a bad ReplyTo: MR375');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain) || '{"To": ["not an address"]}')$$, 'MR303', NULL,
    'a bad recipient: enqueue''s MR303');
SELECT throws_ok(
    $$SELECT pg_temp.send((SELECT doc FROM plain) || jsonb_build_object('Bcc',
        (SELECT jsonb_agg('b' || n || '@allowed.example') FROM generate_series(1, 10) AS n)))$$,
    'MR377', NULL, 'eleven recipients, send.max_recipients 10: MR377'
);

-- idempotency: per key, the same ID, no second count
SELECT is(pg_temp.send((SELECT doc FROM plain), p_idem => 'order-1') ->> 'ID',
    pg_temp.send((SELECT doc FROM plain), p_idem => 'order-1') ->> 'ID', 'the same Idempotency-Key: the same ID');
SELECT is((SELECT count(*) FROM mailroom.audit_log AS a JOIN mailroom.outbound_messages AS m ON m.id = a.outbound_id
           WHERE m.idempotency_key = 'send:' || (SELECT one FROM keys) || ':order-1'), 1::bigint,
    'one audit line for the two');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain), p_idem => E'a b')$$, 'MR375', NULL,
    'an Idempotency-Key with a space: MR375');

-- the rate: one a send, MR020 over it (so far 4 sends of key one in this minute, the replay not counted)
SELECT mailroom.set_setting('send.rate_per_key', '5/min');
SELECT lives_ok($$SELECT pg_temp.send((SELECT doc FROM plain))$$, 'the fifth send of the minute');
SELECT throws_ok($$SELECT pg_temp.send((SELECT doc FROM plain))$$, 'MR020', NULL, 'the sixth: MR020');

SELECT * FROM finish();
ROLLBACK;
