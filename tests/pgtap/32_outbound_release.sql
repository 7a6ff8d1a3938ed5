-- Outbound: releasing a captured message (release_message, http_release_message, release_options):
-- off by default (MR395), the senders (MR396) and owner types (MR397) of the settings, a bad
-- address (MR303), a suppressed one (MR318, dropped or refused), a message of another inbox (MR209);
-- the queued row's bytes: the Resent- block, then the message exactly as received; the claim hands
-- them to the sender. Issue 45: only to release.allowed_recipients (MR021), within the key's and the
-- inbox's rates (MR020), not from a catch-all inbox unless listed (MR397), one audit line each (no
-- address), and a From in a domain mailroom signs for rewritten as a mailing list does.
BEGIN;
SELECT plan(54);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: the claim and the dequeue take rows made by then, the
-- test's alone (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
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
SELECT throws_ok($$SELECT pg_temp.release('dest@example.com')$$, 'MR021', NULL,
    'release.allowed_recipients empty by default: no recipient is allowed, MR021');
SELECT mailroom.set_setting('release.allowed_recipients', '*@example.com');
SELECT throws_ok($$SELECT pg_temp.release('dest@elsewhere.example')$$, 'MR021', NULL, 'a recipient outside the list: MR021');
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
    E'Resent-Date: Sat, 01 Jan 2000 00:00:00 +0000\r\nResent-From: robot@mailroom.test\r\nResent-To: dest@example.com\r\n'
    || 'Resent-Message-ID: ' || (SELECT message_id FROM q) || E'\r\n',
    'and start with the Resent- block (RFC 5322 3.6.6): date, from (the sender), to, the row''s message id'
);
SELECT is(
    (SELECT convert_from(mailroom_internal._resent_block('2000-01-01Z', 'a@b.example', 'c@d.example', '<x@y>', E'\n'), 'UTF8')),
    E'Resent-Date: Sat, 01 Jan 2000 00:00:00 +0000\nResent-From: a@b.example\nResent-To: c@d.example\nResent-Message-ID: <x@y>\n',
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

-- issue 45: the rates (sql/09_rates.sql), per inbox and per key; the error says when to retry
SELECT mailroom.set_setting('outbound.max_message_bytes', '10485760');
CREATE FUNCTION pg_temp.err(p_sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_state text;
    v_message text;
    v_detail text;
BEGIN
    EXECUTE p_sql;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL;
    RETURN v_state || ' ' || coalesce(v_detail, '') || ' ' || v_message;
END;
$$;
CREATE TEMP TABLE o3 AS SELECT mailroom.http_create_mailbox(sha256('mrk_one'::bytea), null) AS doc;
CREATE TEMP TABLE m3 AS SELECT mailroom.deliver_message(
    (SELECT doc ->> 'address' FROM o3), (SELECT b FROM raw), 'app@example.org', 'Your invoice', null, 'Pay 12 EUR'
) AS id;
CREATE FUNCTION pg_temp.release3(p_to text) RETURNS jsonb LANGUAGE sql AS $$
    SELECT mailroom.http_release_message((SELECT doc ->> 'address' FROM o3), null, pg_temp.k(), (SELECT id FROM m3), p_to)
$$;
SELECT mailroom.set_setting('release.rate_per_inbox', '3/min');
SELECT lives_ok($$SELECT pg_temp.release3('one@example.com')$$, 'an inbox''s first release this minute');
SELECT lives_ok($$SELECT pg_temp.release3('two@example.com')$$, 'its second');
SELECT lives_ok($$SELECT pg_temp.release3('three@example.com')$$, 'and its third');
SELECT is(pg_temp.err($$SELECT pg_temp.release3('four@example.com')$$),
    'MR020 60 rate limit reached: release.rate_per_inbox allows 3/min; try again in 60 seconds',
    'the fourth: MR020, DETAIL and message saying when to retry');
SET LOCAL mailroom.clock = '2000-01-01 00:00:59+00';
SELECT is(pg_temp.err($$SELECT pg_temp.release3('four@example.com')$$),
    'MR020 1 rate limit reached: release.rate_per_inbox allows 3/min; try again in 1 seconds',
    'a second before the minute has passed: still refused');
SET LOCAL mailroom.clock = '2000-01-01 00:01:00+00';
SELECT lives_ok($$SELECT pg_temp.release3('four@example.com')$$, 'the next minute: released');
SELECT mailroom.set_setting('release.rate_per_key', '2/min');
CREATE TEMP TABLE o2 AS SELECT mailroom.http_create_mailbox(sha256('mrk_one'::bytea), null) AS doc;
CREATE TEMP TABLE m2 AS SELECT mailroom.deliver_message(
    (SELECT doc ->> 'address' FROM o2), (SELECT b FROM raw), 'app@example.org', 'Your invoice', null, 'Pay 12 EUR'
) AS id;
CREATE FUNCTION pg_temp.release2() RETURNS jsonb LANGUAGE sql AS $$
    SELECT mailroom.http_release_message((SELECT doc ->> 'address' FROM o2), null, pg_temp.k(), (SELECT id FROM m2),
        'dest@example.com')
$$;
SELECT lives_ok($$SELECT pg_temp.release2()$$, 'the key''s second release this minute, from another inbox');
SELECT is(pg_temp.err($$SELECT pg_temp.release2()$$),
    'MR020 60 rate limit reached: release.rate_per_key allows 2/min; try again in 60 seconds',
    'the third: MR020, per key across its inboxes');
SELECT lives_ok(
    format($$SELECT mailroom.release_message(%L, null, %s, 'dest@example.com', 'relay', 'api', 'team-1')$$,
        (SELECT doc ->> 'address' FROM o2), (SELECT id FROM m2)),
    'the application''s form counts per owner, not against the key'
);
SELECT throws_ok($$SELECT mailroom.set_setting('release.rate_per_key', '30 per hour')$$, 'MR003', NULL,
    'a rate is "N/min" or "N/h": MR003');
SELECT mailroom.set_setting('release.rate_per_key', '30/h');

-- catch-all inboxes: only when release.owner_types lists catchall
SELECT mailroom.set_catchall_domain('catch.example', 'team-1');
SELECT mailroom.check_bounce_recipient('someone@catch.example');
CREATE TEMP TABLE cm AS SELECT mailroom.deliver_message(
    'someone@catch.example', (SELECT b FROM raw), 'app@example.org', 'Your invoice', null, 'Pay 12 EUR'
) AS id;
SELECT throws_ok(
    $$SELECT mailroom.http_release_message('someone@catch.example', null, sha256('mrk_one'::bytea), (SELECT id FROM cm),
        'dest@example.com')$$,
    'MR397', 'messages of catch-all inboxes may not be released (release.owner_types does not list catchall)',
    'a catch-all inbox''s message: MR397'
);
SELECT mailroom.set_setting('release.owner_types', 'api,mcp,anonymous,catchall');
SELECT lives_ok(
    $$SELECT mailroom.http_release_message('someone@catch.example', null, sha256('mrk_one'::bytea), (SELECT id FROM cm),
        'dest@example.com')$$,
    'catchall listed: released'
);

-- one audit line per release, no address in it
SELECT is((SELECT count(*)::int FROM mailroom.audit_log WHERE action = 'release'), 9, 'one audit line per release');
SELECT is(
    (SELECT row(key_id = (SELECT id FROM mailroom.api_keys WHERE owner_id = 'team-1'), owner_type, owner_id,
        message_id = (SELECT id FROM m), recipients, at)::text
     FROM mailroom.audit_log WHERE outbound_id = (SELECT (doc ->> 'outbound_id')::bigint FROM r)),
    '(t,api,team-1,t,1,"2000-01-01 00:00:00+00")', 'a line: the key id, the owner, the message, one recipient, when'
);
SELECT is((SELECT count(*)::int FROM mailroom.audit_log WHERE key_id IS NULL), 2,
    'the session token''s and the application''s releases have no key id');
SELECT is((SELECT count(*)::int FROM mailroom.audit_log AS a WHERE a::text LIKE '%@%'), 0, 'no address in the audit log');

-- release is forwarding: a From in a domain mailroom signs for goes out From the release sender
SELECT is(
    mailroom_internal._release_forwarded(
        convert_to(E'From: CEO <ceo@mailroom.test>\r\nTo: t@example.com\r\nSubject: Pay\r\n\r\nFrom: body\r\n', 'UTF8'),
        'robot@mailroom.test'),
    convert_to(E'From: "CEO via mailroom" <robot@mailroom.test>\r\nReply-To: CEO <ceo@mailroom.test>\r\n'
        || E'X-Original-From: CEO <ceo@mailroom.test>\r\nTo: t@example.com\r\nSubject: Pay\r\n\r\nFrom: body\r\n', 'UTF8'),
    'the domain of a sender: From rewritten, the original in Reply-To and X-Original-From, the body untouched'
);
SELECT is(
    mailroom_internal._release_forwarded((SELECT b FROM raw), 'robot@mailroom.test'), (SELECT b FROM raw),
    'a From of a domain mailroom does not sign for: kept byte for byte'
);
INSERT INTO mailroom.dkim_keys (domain, selector, public_key, algorithm, created_at)
VALUES ('operator.example', 'sel', 'AAAA', 'rsa-sha256', mailroom.clock());
SELECT is(
    mailroom_internal._release_forwarded(
        convert_to(E'From: "Chief\n Executive" <ceo@Mail.Operator.example>\nreply-to: x@evil.example\n\nbody', 'UTF8'),
        'robot@mailroom.test'),
    convert_to(E'From: "Chief Executive via mailroom" <robot@mailroom.test>\n'
        || E'X-Original-From: "Chief\n Executive" <ceo@Mail.Operator.example>\nreply-to: x@evil.example\n\nbody', 'UTF8'),
    'a subdomain of a dkim_keys domain, folded, LF line ends, a Reply-To of its own: kept, no second one'
);
SELECT is(
    mailroom_internal._release_forwarded(convert_to(E'From: a@example.org\r\nFROM : b@example.net\r\n\r\n', 'UTF8'),
        'robot@mailroom.test'),
    convert_to(E'From: "a at example.org via mailroom" <robot@mailroom.test>\r\nReply-To: a@example.org\r\n'
        || E'X-Original-From: a@example.org\r\nX-Original-From: b@example.net\r\n\r\n', 'UTF8'),
    'two From fields, whatever their domains: both renamed, one From'
);
SELECT is(
    convert_from(mailroom_internal._release_forwarded(
        convert_to(E'From: ceo@(hidden) operator . example\r\n\r\n', 'UTF8'), 'robot@mailroom.test'), 'UTF8'),
    E'From: "ceo at (hidden) operator . example via mailroom" <robot@mailroom.test>\r\n'
    || E'Reply-To: ceo@(hidden) operator . example\r\nX-Original-From: ceo@(hidden) operator . example\r\n\r\n',
    'a domain behind comments and spaces is still found'
);
SELECT is(
    mailroom_internal._release_forwarded(
        convert_to(E'From: =?UTF-8?B?Wm/Dqw==?= <zoe@operator.example>\r\nSubject: Zoë\r\n\r\nx', 'UTF8'),
        'robot@mailroom.test'),
    convert_to(E'From: =?UTF-8?B?Wm/Dqw==?= via mailroom <robot@mailroom.test>\r\n'
        || E'Reply-To: =?UTF-8?B?Wm/Dqw==?= <zoe@operator.example>\r\n'
        || E'X-Original-From: =?UTF-8?B?Wm/Dqw==?= <zoe@operator.example>\r\nSubject: Zoë\r\n\r\nx', 'UTF8'),
    'an encoded-word name stays one; 8-bit header bytes pass unchanged'
);
SELECT is(
    mailroom_internal._release_forwarded(
        convert_to(E'From: "Zoë \\"Q\\"" <zoe@operator.example>\r\nReply-To: z@x.example\r\n\r\n', 'UTF8'),
        'robot@mailroom.test'),
    convert_to(E'From: "Zoë \\"Q\\" via mailroom" <robot@mailroom.test>\r\n'
        || E'X-Original-From: "Zoë \\"Q\\"" <zoe@operator.example>\r\nReply-To: z@x.example\r\n\r\n', 'UTF8'),
    'a quoted name with quotes and 8-bit letters: quoted again'
);
SELECT is(
    convert_from(mailroom_internal._release_forwarded(
        convert_to(E'Received: by x\r\nSubject: x\r\nFrom: CEO <ceo@mailroom.test>', 'UTF8'), 'robot@mailroom.test'), 'UTF8'),
    E'Received: by x\r\nSubject: x\r\nFrom: "CEO via mailroom" <robot@mailroom.test>\r\nReply-To: CEO <ceo@mailroom.test>\r\n'
    || 'X-Original-From: CEO <ceo@mailroom.test>',
    'a From below other fields, in a message without a body: rewritten in its place'
);
SELECT throws_ok(
    $$SELECT mailroom_internal._release_forwarded('\x46726f6d3a20610062406f70657261746f722e6578616d706c650d0a0d0a'::bytea, 'r@mailroom.test')$$,
    'MR390', NULL, 'a NUL byte in the header: MR390'
);
CREATE TEMP TABLE ceo AS SELECT mailroom.deliver_message(
    pg_temp.oa(),
    convert_to(E'From: CEO <ceo@operator.example>\r\nReply-To: pay@evil.example\r\nSubject: Wire\r\n\r\nNow.\r\n', 'UTF8'),
    'ceo@operator.example', 'Wire', 'CEO <ceo@operator.example>', 'Now.'
) AS id;
CREATE TEMP TABLE ceo_out AS
SELECT mailroom.http_release_message(pg_temp.oa(), null, pg_temp.k(), (SELECT id FROM ceo), 'cfo@example.com') AS doc;
SELECT is(
    (SELECT convert_from(o.raw_message, 'UTF8') FROM mailroom.outbound_messages AS o
     WHERE o.id = (SELECT (doc ->> 'outbound_id')::bigint FROM ceo_out)),
    E'Resent-Date: Sat, 01 Jan 2000 00:01:00 +0000\r\nResent-From: robot@mailroom.test\r\nResent-To: cfo@example.com\r\n'
    || 'Resent-Message-ID: ' || (SELECT o.message_id FROM mailroom.outbound_messages AS o
        WHERE o.id = (SELECT (doc ->> 'outbound_id')::bigint FROM ceo_out)) || E'\r\n'
    || E'From: "CEO via mailroom" <robot@mailroom.test>\r\nX-Original-From: CEO <ceo@operator.example>\r\n'
    || E'Reply-To: pay@evil.example\r\nSubject: Wire\r\n\r\nNow.\r\n',
    'the forged From of the review, released: the queued bytes are From the release sender'
);

SELECT * FROM finish();
ROLLBACK;
