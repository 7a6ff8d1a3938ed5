-- Outbound: webhooks (sql/38_outbound_webhooks.sql): endpoints and their sealed secrets, the events
-- queued where they happen, a webhook row through the one claim, finalize, reaper and replay, and
-- the HTTP face's functions. Its own key, sender, inboxes and rows only: the clock is pinned before any
-- installation existed, so the claim meets the test's rows alone (a row is due once made) and the
-- reaper only leases that ended by then (docs/operations.md, "Verifying an installation").
BEGIN;
SELECT plan(77);
\ir fixtures/default_settings.sql
\ir fixtures/sender_key.sql

SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
SELECT mailroom.set_sender_public_key((SELECT public_key FROM sender_key));
SELECT mailroom.upsert_sender('tap-hooks', 'robot@mailroom.test', '127.0.0.1', 2525);
CREATE TEMP TABLE k AS
SELECT
    mailroom.create_api_key('tap-hook-owner', sha256('mrk_tap_hooks'::bytea)) AS id,
    mailroom.create_api_key('tap-hook-other', sha256('mrk_tap_other'::bytea)) AS other;

-- registration
SELECT has_table('mailroom', 'webhook_endpoints', 'table webhook_endpoints');
SELECT has_column('mailroom', 'outbound_messages', 'kind', 'outbound_messages.kind');
SELECT col_default_is('mailroom', 'outbound_messages', 'kind', 'mail', 'a row is mail unless said otherwise');
SELECT throws_ok(
    $$SELECT * FROM mailroom.add_webhook('ftp://example.com/x', ARRAY['message.received'], (SELECT id FROM k))$$,
    'MR345', NULL, 'not http(s): MR345'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.add_webhook('https://user:pw@example.com/x', ARRAY['message.received'], (SELECT id FROM k))$$,
    'MR345', NULL, 'user info in the URL: MR345'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.add_webhook('https://example.com/x', ARRAY['message.sent'], (SELECT id FROM k))$$,
    'MR346', NULL, 'a sender''s event for a key: MR346'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.add_webhook('https://example.com/x', '{}', (SELECT id FROM k))$$,
    'MR346', NULL, 'no event: MR346'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.add_webhook('https://example.com/x', ARRAY['message.received'])$$,
    'MR348', NULL, 'neither a key nor a sender: MR348'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.add_webhook('https://example.com/x', ARRAY['message.received'], -1)$$,
    'MR356', NULL, 'an unknown key id: MR356'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.add_webhook('https://example.com/x', ARRAY['message.sent'], p_sender => 'no-such-sender')$$,
    'MR355', NULL, 'an unknown sender: MR355'
);

CREATE TEMP TABLE e AS
SELECT a.id, a.secret
FROM mailroom.add_webhook(
    'https://hooks.example.com/in', ARRAY['message.received', 'inbox.expired', 'message.received'], (SELECT id FROM k)
) AS a;
SELECT matches((SELECT secret FROM e), '^whsec_[A-Za-z0-9+/]{32}$', 'the secret: whsec_ and base64 of 24 bytes');
SELECT is(
    (SELECT events FROM mailroom.webhook_endpoints WHERE id = (SELECT id FROM e)),
    ARRAY['inbox.expired', 'message.received'], 'events stored once each, sorted'
);
SELECT is(
    pgp_pub_decrypt(
        (SELECT secret_sealed FROM mailroom.webhook_endpoints WHERE id = (SELECT id FROM e)),
        (SELECT secret_key FROM sender_key)
    ),
    (SELECT secret FROM e), 'sealed for the sender key: only its private half opens it'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.webhook_endpoints AS w
     WHERE w.id = (SELECT id FROM e) AND strpos(encode(w.secret_sealed, 'escape'), (SELECT secret FROM e)) > 0),
    0, 'the secret is not stored in the clear'
);
SELECT is(
    (SELECT owner_id FROM mailroom.webhook_endpoints WHERE id = (SELECT id FROM e)), 'tap-hook-owner',
    'an API key''s endpoint carries its owner (the delivery path looks up by owner)'
);
SELECT is(
    (SELECT url FROM mailroom.list_webhooks((SELECT id FROM k))), 'https://hooks.example.com/in',
    'list_webhooks: the key''s endpoint'
);
SELECT mailroom.set_setting('webhooks.max_endpoints_per_key', '2');
SELECT lives_ok(
    $$SELECT * FROM mailroom.add_webhook('https://hooks.example.com/2', ARRAY['inbox.expired'], (SELECT id FROM k))$$,
    'a second endpoint'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.add_webhook('https://hooks.example.com/3', ARRAY['inbox.expired'], (SELECT id FROM k))$$,
    'MR347', NULL, 'over webhooks.max_endpoints_per_key: MR347'
);
SELECT lives_ok(
    $$SELECT mailroom.remove_webhook((SELECT w.id FROM mailroom.webhook_endpoints AS w WHERE w.url = 'https://hooks.example.com/2'))$$,
    'remove_webhook'
);
SELECT throws_ok($$SELECT mailroom.remove_webhook(-1)$$, 'MR348', NULL, 'an unknown endpoint: MR348');

-- message.received: queued by deliver_message for the owner's inbox, in the same transaction
CREATE TEMP TABLE b AS
SELECT
    (SELECT address FROM mailroom.create_mailbox(60, 'free', 'api', 'tap-hook-owner')) AS mine,
    (SELECT address FROM mailroom.create_mailbox(60, 'free', 'api', 'tap-hook-other')) AS theirs,
    (SELECT address FROM mailroom.create_mailbox(60, 'free')) AS anon;
CREATE TEMP TABLE d AS
SELECT mailroom.deliver_message(
    (SELECT mine FROM b), 'Subject: hi'::bytea, 'a@example.org', '{"subject": "hi", "from_header": "A <a@example.org>"}'::jsonb
) AS message_id;
SELECT mailroom.deliver_message((SELECT theirs FROM b), 'Subject: x'::bytea, 'a@example.org', '{}'::jsonb);
SELECT mailroom.deliver_message((SELECT anon FROM b), 'Subject: x'::bytea, 'a@example.org', '{}'::jsonb);
CREATE TEMP TABLE h AS
SELECT m.* FROM mailroom.outbound_messages AS m WHERE m.kind = 'webhook' AND m.webhook_endpoint_id = (SELECT id FROM e);
SELECT is((SELECT count(*)::integer FROM h), 1, 'one delivery: the owner''s inbox only (not another owner''s, not anonymous)');
SELECT is((SELECT subject FROM h), 'message.received', 'its event type');
SELECT ok((SELECT sender_id IS NULL AND status = 'queued' FROM h), 'queued, no sender');
SELECT matches((SELECT message_id FROM h), '^msg_[0-9a-f]{32}$', 'its webhook-id: msg_ + 32 hex digits');
SELECT is(
    (SELECT text_body::jsonb - 'timestamp' FROM h),
    jsonb_build_object('type', 'message.received', 'data', jsonb_build_object(
        'address', (SELECT mine FROM b), 'message_id', (SELECT message_id FROM d),
        'received_at', '2000-01-01T00:00:00+00:00'::timestamptz, 'size_bytes', 11,
        'from', 'A <a@example.org>', 'subject', 'hi'
    )),
    'its payload: Standard Webhooks'' type, timestamp, data'
);
SELECT is((SELECT text_body::jsonb ->> 'timestamp' FROM h), '2000-01-01T00:00:00.000000Z', 'the timestamp: mailroom.clock()');
SELECT ok(
    (SELECT count(*) FROM pg_catalog.pg_trigger AS t WHERE t.tgname = 'after_mailboxes_expired') = 1,
    'the expiry trigger exists'
);

-- the payload's bound: the text a stranger chose is cut, never the delivery refused
SELECT mailroom.set_setting('webhooks.max_payload_bytes', '1024');
SELECT mailroom.deliver_message(
    (SELECT mine FROM b), 'Subject: long'::bytea, 'a@example.org', jsonb_build_object('subject', repeat('s', 1500))
);
SELECT ok(
    (SELECT octet_length(m.text_body) <= 1024 AND (m.text_body::jsonb -> 'data' ->> 'truncated')::boolean
     FROM mailroom.outbound_messages AS m
     WHERE m.kind = 'webhook' AND m.webhook_endpoint_id = (SELECT id FROM e) ORDER BY m.id DESC LIMIT 1),
    'over webhooks.max_payload_bytes: subject cut, flagged truncated'
);

-- inbox.expired: the expiry's UPDATE of is_active fires it; a delivery's UPDATE does not
UPDATE mailroom.mailboxes AS m SET is_active = false, inactive_since = m.expires_at
WHERE m.address = (SELECT mine FROM b);
SELECT is(
    (SELECT m.text_body::jsonb -> 'data' ->> 'address' FROM mailroom.outbound_messages AS m
     WHERE m.kind = 'webhook' AND m.webhook_endpoint_id = (SELECT id FROM e) AND m.subject = 'inbox.expired'),
    (SELECT mine FROM b), 'inbox.expired queued when the inbox expires'
);
UPDATE mailroom.mailboxes AS m SET is_active = false, inactive_since = m.expires_at
WHERE m.address = (SELECT theirs FROM b);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.outbound_messages AS m WHERE m.kind = 'webhook' AND m.subject = 'inbox.expired'
     AND m.webhook_endpoint_id = (SELECT id FROM e)),
    1, 'another owner''s inbox expiring queues nothing for this endpoint'
);

-- the outcome of an HTTP answer
SELECT is(mailroom_internal._classify_outcome('http', 200, NULL), 'sent', '2xx: sent');
SELECT is(mailroom_internal._classify_outcome('http', 204, NULL), 'sent', '204: sent');
SELECT is(mailroom_internal._classify_outcome('http', 404, NULL), 'permanent', '4xx: failed at once');
SELECT is(mailroom_internal._classify_outcome('http', 408, NULL), 'transient', '408: retried');
SELECT is(mailroom_internal._classify_outcome('http', 429, NULL), 'transient', '429: retried');
SELECT is(mailroom_internal._classify_outcome('http', 500, NULL), 'transient', '5xx: retried');
SELECT is(mailroom_internal._classify_outcome('http', 302, NULL), 'transient', 'a redirect (not followed): retried');
SELECT is(mailroom_internal._reply_class('http', 200), '2xx', 'the metric class of a 2xx');

-- the one claim: a webhook row comes with its URL and sealed secret, no relay
UPDATE mailroom.outbound_messages AS m SET priority = 10
WHERE m.kind = 'webhook' AND m.id = (SELECT id FROM h);
CREATE TEMP TABLE c AS
SELECT x.* FROM mailroom.claim_messages(1, 'tap-worker') AS x;
SELECT is((SELECT id FROM c), (SELECT id FROM h), 'claimed by claim_messages like any row');
SELECT is((SELECT kind FROM c), 'webhook', 'its kind');
SELECT is((SELECT webhook_url FROM c), 'https://hooks.example.com/in', 'its endpoint''s URL');
SELECT is(
    pgp_pub_decrypt((SELECT webhook_secret_sealed FROM c), (SELECT secret_key FROM sender_key)), (SELECT secret FROM e),
    'its secret, sealed: the sender opens it'
);
SELECT ok((SELECT smtp_host IS NULL AND sender_name IS NULL FROM c), 'no relay');
SELECT is((SELECT message_id FROM c), (SELECT message_id FROM h), 'its webhook-id');

-- finalize: a 500 is retried with the queue's backoff
SELECT is(
    (SELECT f.result FROM mailroom.finalize_messages(
        ARRAY[(SELECT id FROM c)], ARRAY[(SELECT claim_token FROM c)], ARRAY['http'], ARRAY[500], NULL, ARRAY['HTTP 500']
    ) AS f),
    'retry', 'HTTP 500: retry'
);
SELECT is(
    (SELECT (attempts, next_retry_at, last_smtp_code)::text FROM mailroom.outbound_messages WHERE id = (SELECT id FROM h)),
    (1, '2000-01-01 00:01Z'::timestamptz, 500)::text, 'attempts² minutes, the status kept'
);

-- the reaper takes a silent worker's row back, possibly sent; its delivery is then counted
UPDATE mailroom.outbound_messages AS m SET next_retry_at = NULL WHERE m.id = (SELECT id FROM h);
TRUNCATE c;
INSERT INTO c SELECT x.* FROM mailroom.claim_messages(1, 'tap-worker', '1 second') AS x;
SET LOCAL mailroom.clock = '2000-01-01 00:10Z';
CREATE TEMP TABLE dup AS
SELECT value FROM mailroom.outbound_counters WHERE name = 'webhook_possible_duplicates';
SELECT is(mailroom.reap_stuck_messages(), 1, 'reaped: this test''s row alone (the clock is before every other lease)');
SELECT ok((SELECT possibly_sent FROM mailroom.outbound_messages WHERE id = (SELECT id FROM h)), 'flagged possibly sent');
TRUNCATE c;
INSERT INTO c SELECT x.* FROM mailroom.claim_messages(1, 'tap-worker') AS x;
SELECT ok((SELECT possibly_sent AND id = (SELECT id FROM h) FROM c), 'claimed again, possibly sent: the sender flags it');
SELECT is(
    (SELECT f.result FROM mailroom.finalize_messages(
        ARRAY[(SELECT id FROM c)], ARRAY[(SELECT claim_token FROM c)], ARRAY['http'], ARRAY[200]
    ) AS f),
    'sent', 'HTTP 200: sent'
);
SELECT is(
    (SELECT value FROM mailroom.outbound_counters WHERE name = 'webhook_possible_duplicates') - (SELECT value FROM dup),
    1::bigint, 'a possibly duplicated delivery is counted'
);

-- attempts visible, replay
SELECT is(
    (SELECT (status, attempts, last_status)::text FROM mailroom.webhook_deliveries((SELECT id FROM e)) WHERE id = (SELECT id FROM h)),
    ('sent', 3, 200)::text, 'webhook_deliveries: the delivery with its attempts'
);
SELECT ok(
    (SELECT attempt_log ~ 'attempt 1 http: HTTP 500' FROM mailroom.webhook_deliveries((SELECT id FROM e)) WHERE id = (SELECT id FROM h)),
    'its attempt log'
);
SELECT is(mailroom.replay_webhook((SELECT id FROM h)), (SELECT id FROM h), 'replay_webhook');
SELECT is(
    (SELECT (status, attempts, message_id)::text FROM mailroom.outbound_messages WHERE id = (SELECT id FROM h)),
    ('queued', 0, (SELECT message_id FROM h))::text, 'queued again, attempts from 0, the same webhook-id'
);
SELECT throws_ok(format('SELECT mailroom.replay_webhook(%s)', (SELECT id FROM h)), 'MR354', NULL, 'still queued: MR354');
SELECT throws_ok($$SELECT mailroom.replay_webhook(-1)$$, 'MR349', NULL, 'an unknown delivery: MR349');

-- a sender of the previous release cannot send a webhook row: its 'local' is retried while the
-- endpoint is there (a sender of this release takes it); once the endpoint is removed, 'local' fails
UPDATE mailroom.outbound_messages AS m SET priority = 10 WHERE m.id = (SELECT id FROM h);
TRUNCATE c;
INSERT INTO c SELECT x.* FROM mailroom.claim_messages(1, 'tap-worker') AS x;
SELECT is(
    (SELECT f.result FROM mailroom.finalize_messages(
        ARRAY[(SELECT id FROM c)], ARRAY[(SELECT claim_token FROM c)], ARRAY['local'], p_errors => ARRAY['cannot build the message: KeyError']
    ) AS f),
    'retry', 'local from a sender that cannot send webhooks: retried'
);
UPDATE mailroom.outbound_messages AS m SET next_retry_at = NULL WHERE m.id = (SELECT id FROM h);
TRUNCATE c;
INSERT INTO c SELECT x.* FROM mailroom.claim_messages(1, 'tap-worker') AS x;
SELECT is(
    (SELECT f.result FROM mailroom.finalize_messages(
        ARRAY[(SELECT id FROM c)], ARRAY[(SELECT claim_token FROM c)], ARRAY['reply'], ARRAY[554], ARRAY['5.5.1']
    ) AS f),
    'retry', 'an SMTP 5xx for a webhook row (a mail relay answered it): retried, never a failure'
);
UPDATE mailroom.outbound_messages AS m SET next_retry_at = NULL WHERE m.id = (SELECT id FROM h);

-- a 404 fails at once, a 429 is retried
UPDATE mailroom.outbound_messages AS m SET priority = 10 WHERE m.id = (SELECT id FROM h);
TRUNCATE c;
INSERT INTO c SELECT x.* FROM mailroom.claim_messages(1, 'tap-worker') AS x;
SELECT is(
    (SELECT f.result FROM mailroom.finalize_messages(
        ARRAY[(SELECT id FROM c)], ARRAY[(SELECT claim_token FROM c)], ARRAY['http'], ARRAY[404]
    ) AS f),
    'failed', 'HTTP 404: failed at once'
);

-- a sender's endpoint: message.sent and message.failed from finalize, message.bounced
CREATE TEMP TABLE se AS
SELECT a.id FROM mailroom.add_webhook(
    'https://hooks.example.com/mail', ARRAY['message.sent', 'message.failed', 'message.bounced'], p_sender => 'tap-hooks'
) AS a;
CREATE TEMP TABLE mail AS
SELECT mailroom.enqueue_message('tap-hooks', ARRAY['rcpt@example.com'], 's', 't') AS id;
UPDATE mailroom.outbound_messages AS m SET priority = 10 WHERE m.id = (SELECT id FROM mail);
TRUNCATE c;
INSERT INTO c SELECT x.* FROM mailroom.claim_messages(1, 'tap-worker') AS x;
SELECT is((SELECT kind FROM c), 'mail', 'a mail row is of kind mail');
SELECT mailroom.finalize_messages(ARRAY[(SELECT id FROM c)], ARRAY[(SELECT claim_token FROM c)], ARRAY['sent']);
SELECT is(
    (SELECT (m.subject, (m.text_body::jsonb -> 'data' ->> 'outbound_id')::bigint)::text FROM mailroom.outbound_messages AS m
     WHERE m.kind = 'webhook' AND m.webhook_endpoint_id = (SELECT id FROM se)),
    ('message.sent', (SELECT id FROM mail))::text, 'a sent mail queues message.sent for its sender''s endpoint'
);
CREATE TEMP TABLE mail2 AS
SELECT mailroom.enqueue_message('tap-hooks', ARRAY['other@example.com'], 's', 't', p_priority => 10) AS id;
TRUNCATE c;
INSERT INTO c SELECT x.* FROM mailroom.claim_messages(1, 'tap-worker') AS x;
SELECT is(
    (SELECT f.result FROM mailroom.finalize_messages(
        ARRAY[(SELECT id FROM c)], ARRAY[(SELECT claim_token FROM c)], ARRAY['reply'], ARRAY[550], ARRAY['5.1.1']
    ) AS f),
    'failed', 'a mail refused 5.1.1 fails'
);
SELECT is(
    (SELECT (m.text_body::jsonb -> 'data' ->> 'status', m.text_body::jsonb -> 'data' ->> 'enhanced_code')::text
     FROM mailroom.outbound_messages AS m
     WHERE m.kind = 'webhook' AND m.webhook_endpoint_id = (SELECT id FROM se) AND m.subject = 'message.failed'
         AND (m.text_body::jsonb -> 'data' ->> 'outbound_id')::bigint = (SELECT id FROM mail2)),
    ('failed', '5.1.1')::text, 'a failed mail queues message.failed for its sender''s endpoint'
);
SELECT mailroom.set_sender_bounce_domain('tap-hooks', 'hooks-bounces.example.org');
SELECT is(
    (SELECT outcome FROM mailroom.record_bounce(
        (mailroom_internal._return_paths((SELECT id FROM mail), (SELECT id FROM mailroom.senders WHERE name = 'tap-hooks'), 1))[1],
        '[{"recipient": "rcpt@example.com", "action": "failed", "status": "5.1.1", "smtp_code": "550"}]'
    )),
    'hard_bounce', 'a bounce report about the mail'
);
SELECT is(
    (SELECT m.text_body::jsonb -> 'data' FROM mailroom.outbound_messages AS m
     WHERE m.kind = 'webhook' AND m.webhook_endpoint_id = (SELECT id FROM se) AND m.subject = 'message.bounced'),
    jsonb_build_object('outbound_id', (SELECT id FROM mail), 'bounce', 'hard_bounce', 'smtp_code', 550, 'status', '5.1.1'),
    'record_bounce queues message.bounced for its sender''s endpoint (no address in it)'
);

-- the HTTP face: a key's own endpoints
SELECT throws_ok($$SELECT mailroom.http_list_webhooks(NULL)$$, 'MR240', NULL, 'no key: MR240');
SELECT throws_ok($$SELECT mailroom.http_list_webhooks(sha256('nope'::bytea))$$, 'MR241', NULL, 'an unknown key: MR241');
CREATE TEMP TABLE ha AS
SELECT mailroom.http_add_webhook(sha256('mrk_tap_other'::bytea), 'https://other.example.com/h', ARRAY['message.received']) AS doc;
SELECT matches((SELECT doc ->> 'secret' FROM ha), '^whsec_', 'http_add_webhook answers the secret once');
SELECT is(
    (SELECT jsonb_path_query_array(mailroom.http_list_webhooks(sha256('mrk_tap_other'::bytea)), '$[*].url')),
    '["https://other.example.com/h"]'::jsonb, 'http_list_webhooks: the key''s own endpoints only'
);
SELECT ok(
    strpos(mailroom.http_list_webhooks(sha256('mrk_tap_other'::bytea))::text, 'whsec_') = 0, 'never a secret in a listing'
);
SELECT throws_ok(
    format('SELECT mailroom.http_remove_webhook(sha256(''mrk_tap_other''::bytea), %s)', (SELECT id FROM e)),
    'MR348', NULL, 'another key''s endpoint: MR348'
);
SELECT throws_ok(
    format('SELECT mailroom.http_replay_webhook(sha256(''mrk_tap_other''::bytea), %s)', (SELECT id FROM h)),
    'MR349', NULL, 'another key''s delivery: MR349'
);
SELECT is(
    mailroom.http_remove_webhook(sha256('mrk_tap_other'::bytea), ((SELECT doc FROM ha) ->> 'id')::bigint) ->> 'removed',
    'true', 'http_remove_webhook'
);

-- a delivery queued for an endpoint whose API key was revoked since is not sent: the claim gives it no
-- URL, as for a removed endpoint (the attacker review of issue 45: a revoked key's deliveries still went)
SELECT mailroom.replay_webhook((SELECT id FROM h));
SAVEPOINT revoked;
SELECT ok(mailroom.revoke_api_key((SELECT id FROM k)), 'the endpoint''s API key revoked');
UPDATE mailroom.outbound_messages AS m SET priority = 10 WHERE m.id = (SELECT id FROM h);
TRUNCATE c;
INSERT INTO c SELECT x.* FROM mailroom.claim_messages(1, 'tap-worker') AS x;
SELECT ok(
    (SELECT id = (SELECT id FROM h) AND webhook_url IS NULL AND webhook_secret_sealed IS NULL FROM c),
    'claimed with no URL and no secret: the sender fails it, nothing is sent'
);
ROLLBACK TO SAVEPOINT revoked;

-- a delivery whose endpoint was removed fails at once ('local': nothing to send it to)
SELECT mailroom.remove_webhook((SELECT id FROM e));
UPDATE mailroom.outbound_messages AS m SET priority = 10 WHERE m.id = (SELECT id FROM h);
TRUNCATE c;
INSERT INTO c SELECT x.* FROM mailroom.claim_messages(1, 'tap-worker') AS x;
SELECT is(
    (SELECT f.result FROM mailroom.finalize_messages(
        ARRAY[(SELECT id FROM c)], ARRAY[(SELECT claim_token FROM c)], ARRAY['local'], p_errors => ARRAY['the webhook endpoint was removed']
    ) AS f),
    'failed', 'local for a removed endpoint: failed'
);

SELECT * FROM finish();
ROLLBACK;
