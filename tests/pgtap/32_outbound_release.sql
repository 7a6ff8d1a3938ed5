-- Outbound: releasing a captured message (release_message, http_release_message, release_options):
-- off by default (MR395), the senders (MR396) and owner types (MR397) of the settings, a bad
-- address (MR303), a suppressed one (MR318, dropped or refused), a message of another inbox (MR209);
-- the queued row's bytes: the Resent- block, then the message exactly as received; the claim hands
-- them to the sender.
BEGIN;
SELECT plan(26);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
SELECT mailroom.upsert_sender('relay', 'robot@mailroom.test', '127.0.0.1', 2525);
SELECT mailroom.upsert_sender('other', 'other@mailroom.test', '127.0.0.1', 2526);
SELECT mailroom.create_api_key('team-1', sha256('mrk_one'::bytea));
CREATE TEMP TABLE o AS SELECT mailroom.http_create_mailbox(sha256('mrk_one'::bytea), null) AS doc;
CREATE TEMP TABLE j AS SELECT mailroom.http_create_mailbox(null, '192.0.2.1') AS doc;
CREATE FUNCTION pg_temp.oa() RETURNS text LANGUAGE sql AS $$ SELECT doc ->> 'address' FROM o $$;
CREATE FUNCTION pg_temp.k() RETURNS bytea LANGUAGE sql AS $$ SELECT sha256('mrk_one'::bytea) $$;
CREATE TEMP TABLE raw AS SELECT convert_to(
    E'From: App <app@example.org>\r\nTo: x@y.example\r\nSubject: Your invoice\r\n\r\nPay 12 EUR\r\n', 'UTF8'
) AS b;
CREATE TEMP TABLE m AS SELECT mailroom.deliver_message(
    pg_temp.oa(), (SELECT b FROM raw), 'app@example.org', 'Your invoice', 'App <app@example.org>', 'Pay 12 EUR'
) AS id;
CREATE TEMP TABLE am AS SELECT mailroom.deliver_message(
    (SELECT doc ->> 'address' FROM j), (SELECT b FROM raw), 'app@example.org', 'Your invoice', null, 'Pay 12 EUR'
) AS id;
CREATE FUNCTION pg_temp.release(p_to text, p_sender text DEFAULT null) RETURNS jsonb LANGUAGE sql AS $$
    SELECT mailroom.http_release_message(pg_temp.oa(), null, pg_temp.k(), (SELECT id FROM m), p_to, p_sender)
$$;

-- off by default
SELECT is(mailroom.release_options(), '{"enabled": false, "senders": []}'::jsonb, 'release is off by default');
SELECT throws_ok($$SELECT pg_temp.release('dest@example.com')$$, 'MR395', NULL, 'off: MR395');
SELECT is((SELECT value FROM mailroom.settings WHERE name = 'release.owner_types'), 'api,mcp',
    'owner types api and mcp by default (not anonymous)');

SELECT mailroom.set_setting('release.senders', ' relay , ');
SELECT is(mailroom.release_options(), '{"enabled": true, "senders": ["relay"]}'::jsonb, 'on: the senders, trimmed');
SELECT throws_ok($$SELECT pg_temp.release('dest@example.com', 'other')$$, 'MR396', NULL, 'a sender not listed: MR396');
SELECT throws_ok(
    format($$SELECT mailroom.http_release_message(%L, %L, null, (SELECT id FROM am), 'dest@example.com')$$,
        (SELECT doc ->> 'address' FROM j), (SELECT doc ->> 'session_token' FROM j)),
    'MR397', NULL, 'an anonymous inbox''s message: MR397'
);
SELECT throws_ok(
    format($$SELECT mailroom.http_release_message(%L, null, sha256('mrk_two'::bytea), (SELECT id FROM m), 'd@example.com')$$,
        pg_temp.oa()),
    'MR241', NULL, 'an unknown key: MR241 (the owner rule)'
);
SELECT throws_ok(
    format($$SELECT mailroom.http_release_message(%L, null, sha256('mrk_one'::bytea), (SELECT id FROM am), 'd@example.com')$$,
        pg_temp.oa()),
    'MR209', NULL, 'a message of another inbox: MR209'
);
SELECT throws_ok($$SELECT pg_temp.release('not an address')$$, 'MR303', NULL, 'a bad address: MR303');
SELECT throws_ok($$SELECT pg_temp.release(null)$$, 'MR303', NULL, 'no address: MR303');
SELECT mailroom.suppress('blocked@example.com', 'manual');
SELECT throws_ok($$SELECT pg_temp.release('blocked@example.com')$$, 'MR318', NULL, 'a suppressed address: MR318');
SELECT mailroom.set_setting('outbound.drop_suppressed_recipients', 'true');
SELECT throws_ok($$SELECT pg_temp.release('blocked@example.com')$$, 'MR318', NULL,
    'dropped, so no recipient is left: MR318 all the same');
SELECT mailroom.set_setting('release.owner_types', 'api,mcp,anonymous');
SELECT is(
    mailroom.http_release_message((SELECT doc ->> 'address' FROM j), (SELECT doc ->> 'session_token' FROM j), null,
        (SELECT id FROM am), 'dest@example.com') ->> 'sender',
    'relay', 'anonymous in release.owner_types: released with its session token, through the first sender'
);

-- a release: the row and its bytes
CREATE TEMP TABLE r AS SELECT pg_temp.release(' dest@example.com ') AS doc;
SELECT is((SELECT doc - 'outbound_id' FROM r), '{"to": "dest@example.com", "sender": "relay"}'::jsonb,
    'released: the address (trimmed) and the sender');
CREATE TEMP TABLE q AS SELECT ob.* FROM mailroom.outbound_messages AS ob WHERE ob.id = (SELECT (doc ->> 'outbound_id')::bigint FROM r);
SELECT is(
    (SELECT row(status, to_addrs, subject, text_body)::text FROM q),
    '(queued,{dest@example.com},"Your invoice","Pay 12 EUR")', 'queued for the address, with the original''s subject and text'
);
SELECT is(
    (SELECT substring(raw_message FROM octet_length(raw_message) - octet_length((SELECT b FROM raw)) + 1) FROM q),
    (SELECT b FROM raw), 'the bytes end with the message exactly as received'
);
SELECT is(
    (SELECT convert_from(substring(raw_message FOR octet_length(raw_message) - octet_length((SELECT b FROM raw))), 'UTF8')
     FROM q),
    E'Resent-Date: Tue, 01 Jan 2030 00:00:00 +0000\r\nResent-From: robot@mailroom.test\r\nResent-To: dest@example.com\r\n'
    || 'Resent-Message-ID: ' || (SELECT message_id FROM q) || E'\r\n',
    'and start with the Resent- block (RFC 5322 3.6.6): date, from (the sender), to, the row''s message id'
);
SELECT is(
    (SELECT convert_from(mailroom_internal._resent_block('2030-01-01Z', 'a@b.example', 'c@d.example', '<x@y>', E'\n'), 'UTF8')),
    E'Resent-Date: Tue, 01 Jan 2030 00:00:00 +0000\nResent-From: a@b.example\nResent-To: c@d.example\nResent-Message-ID: <x@y>\n',
    'a message stored with LF line ends gets an LF block'
);
SELECT is(
    (SELECT raw_message FROM mailroom.claim_messages(10, 'tap') WHERE id = (SELECT id FROM q)),
    (SELECT raw_message FROM q), 'the claim hands the bytes to the sender'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.claim_messages(10, 'tap') WHERE raw_message IS NOT NULL), 0,
    'claimed already'
);

-- too large for the queue
SELECT mailroom.set_setting('outbound.max_message_bytes', '100');
SELECT throws_ok($$SELECT pg_temp.release('dest@example.com')$$, 'MR306', NULL, 'over outbound.max_message_bytes: MR306');
SELECT throws_ok(
    format($$SELECT mailroom.release_message(%L, null, (SELECT id FROM m), 'd@example.com', 'relay', 'api', 'team-2')$$,
        pg_temp.oa()),
    'MR204', NULL, 'release_message (the application''s form): another owner, MR204'
);

-- erasure: released bytes holding the address go whole (sent as the erased subject and text)
SELECT lives_ok($$SELECT mailroom.erase_address('billing@shop.example')$$, 'erase an address');
SELECT is((SELECT raw_message FROM mailroom.outbound_messages WHERE id = (SELECT id FROM q)),
    (SELECT raw_message FROM q), 'bytes without it stay');
SELECT lives_ok($$SELECT mailroom.erase_address('x@y.example')$$, 'erase the address the original''s To names');
SELECT is((SELECT raw_message FROM mailroom.outbound_messages WHERE id = (SELECT id FROM q)), null::bytea,
    'bytes holding it go');

SELECT * FROM finish();
ROLLBACK;
