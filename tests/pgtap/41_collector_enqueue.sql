-- Collector --enqueue: dequeue + enqueue in one transaction; the claim renders each attempt with a fresh link.
BEGIN;
SELECT plan(19);
\ir fixtures/default_settings.sql
-- the clock before any installation existed: the dequeue and the claim take rows made by then, so
-- they meet the test's tokens and messages alone (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';

SELECT mailroom.create_account('ann@example.test', 'ann');
SELECT mailroom.create_account('bob@example.test', 'bob');
SELECT mailroom.create_account('cyd@example.test', 'cyd');

-- errors first: each rolls back with its subtransaction, the tokens stay eligible
SELECT throws_ok(
    $$SELECT mailroom.enqueue_token_emails(10)$$,
    'MR301', 'unknown sender ''mailroom''', 'no such sender: the outbound error, nothing dequeued'
);
-- written around set_setting (which may refuse it), as a value stored before validation would be
UPDATE mailroom.settings SET value = ' ' WHERE name = 'collector.sender';
SELECT throws_ok(
    $$SELECT mailroom.enqueue_token_emails(10)$$,
    'MR404', 'setting collector.sender is empty', 'empty sender setting: MR404'
);
SELECT mailroom.set_setting('collector.sender', 'mailroom');
SELECT mailroom.upsert_sender('mailroom', 'noreply@example.test', '127.0.0.1', 2525);
UPDATE mailroom.token_email_templates SET subject = 'Hi {{login}}'
WHERE action = 'activation';
SELECT mailroom.set_setting('collector.link_base_url', 'https://app.example.test');

-- an application message that uses the key token:<id> of ann's token (same namespace before)
SELECT mailroom.enqueue_message(
    'mailroom', ARRAY['someone@example.test'], 'app', 't',
    p_idempotency_key => 'token:' || (SELECT min(t.id) FROM mailroom.tokens AS t WHERE t.account = (SELECT a.id FROM mailroom.accounts AS a WHERE a.login = 'ann'))
);
SELECT is(
    mailroom.enqueue_token_emails(2), 2,
    'a full batch enqueues 2 emails (an application message keyed token:<id> takes none of them)'
);
SELECT is(mailroom.enqueue_token_emails(2, decode(repeat('ab', 32), 'hex')), 1,
    'the rest: 1 email (the deprecated keyed form, its key unused)');
SELECT is(mailroom.enqueue_token_emails(2), 0, 'then nothing is left');
SELECT is(
    (SELECT count(*)::integer FROM mailroom.dequeue_tokens(10)), 0,
    'the tokens were dispatched in this transaction'
);

SELECT results_eq(
    $$SELECT to_addrs[1], subject, status::text FROM mailroom.outbound_messages
      WHERE idempotency_scope = 'mailroom' AND to_addrs[1] LIKE '%@example.test' ORDER BY id$$,
    $$VALUES ('ann@example.test', 'Hi ann', 'queued'), ('bob@example.test', 'Hi bob', 'queued'),
             ('cyd@example.test', 'Hi cyd', 'queued')$$,
    'one queued message per token, in token order, rendered from the template'
);
SELECT ok(
    (SELECT bool_and(idempotency_key ~ '^token:[0-9]+$') FROM mailroom.outbound_messages WHERE idempotency_scope = 'mailroom' AND to_addrs[1] LIKE '%@example.test'),
    'idempotency key is token:<id>, in scope mailroom'
);
SELECT is(
    (
        SELECT array_agg(idempotency_scope || ' ' || to_addrs[1] ORDER BY idempotency_scope)
        FROM mailroom.outbound_messages
        WHERE idempotency_key = 'token:' || (SELECT min(t.id) FROM mailroom.tokens AS t WHERE t.account = (SELECT a.id FROM mailroom.accounts AS a WHERE a.login = 'ann'))
    ),
    ARRAY['app someone@example.test', 'mailroom ann@example.test'],
    'the application''s token:<id> message no longer suppresses the activation email with that key'
);
-- issue 21.3: nothing in the queue opens an account; the claim renders each attempt with a fresh link
SELECT results_eq(
    $$SELECT count(*)::int, count(*) FILTER (WHERE text_body IS NULL AND html_body IS NULL AND token_id IS NOT NULL)::int,
          count(*) FILTER (WHERE t.secret_digest IS NULL AND t.dispatched_at IS NOT NULL)::int
      FROM mailroom.outbound_messages AS m JOIN mailroom.tokens AS t ON t.id = m.token_id
      WHERE m.idempotency_scope = 'mailroom' AND m.to_addrs[1] LIKE '%@example.test'$$,
    $$VALUES (3, 3, 3)$$,
    'a queued token email has no body and its token no secret yet (nothing minted before the delivery attempt)'
);
CREATE TEMP TABLE claim1 AS
SELECT c.* FROM mailroom.claim_messages(10, 'tap') AS c
WHERE c.id IN (SELECT id FROM mailroom.outbound_messages WHERE idempotency_scope = 'mailroom' AND to_addrs[1] LIKE '%@example.test');
SELECT ok(
    (SELECT count(*) = 3 AND bool_and(text_body ~ 'https://app\.example\.test/activate\?token=[A-Za-z0-9_-]{86}\n') FROM claim1),
    'the claim renders every text body with an 86-character signed activation link'
);
SELECT ok(
    (SELECT bool_and(html_body LIKE '%<a href="https://app.example.test/activate?token=%') FROM claim1),
    'and every HTML body links it'
);
SELECT results_eq(
    $$SELECT count(*)::int FROM mailroom.outbound_messages
      WHERE idempotency_scope = 'mailroom' AND to_addrs[1] LIKE '%@example.test' AND (text_body IS NOT NULL OR html_body IS NOT NULL OR subject LIKE '%token=%')$$,
    $$VALUES (0)$$,
    'the link exists only in the claim''s result: the rows still hold no body'
);
-- a second attempt (a retry, a reaped claim, outbound retry) carries a fresh link; the first stops working
UPDATE mailroom.outbound_messages SET status = 'queued', claim_token = NULL
WHERE id = (SELECT min(id) FROM claim1);
CREATE TEMP TABLE claim2 AS SELECT c.* FROM mailroom.claim_messages(10, 'tap') AS c WHERE c.id = (SELECT min(id) FROM claim1);
SELECT isnt(
    substring((SELECT text_body FROM claim2) FROM 'token=([A-Za-z0-9_-]+)'),
    substring((SELECT text_body FROM claim1 WHERE id = (SELECT min(id) FROM claim1)) FROM 'token=([A-Za-z0-9_-]+)'),
    'a second delivery attempt carries a freshly minted link'
);
SELECT throws_ok(
    format('SELECT mailroom.consume_token(%L)',
        substring((SELECT text_body FROM claim1 WHERE id = (SELECT min(id) FROM claim1)) FROM 'token=([A-Za-z0-9_-]+)')),
    'MR112', 'unknown token', 'the first attempt''s link no longer works'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.consume_token(substring((SELECT text_body FROM claim2) FROM 'token=([A-Za-z0-9_-]+)'))),
    1,
    'the latest link consumes'
);
SELECT is(
    (
        SELECT status::text FROM mailroom.accounts
        WHERE login = 'ann'
    ),
    'active', 'ann is activated by her link'
);

-- recovery: the email shows the code and links /recover
SELECT mailroom.request_password_recovery('ann@example.test');
-- the request is issued by this call (sql/13_recovery.sql) and sent by the next
SELECT mailroom.enqueue_token_emails(10);
SELECT is(mailroom.enqueue_token_emails(10), 1, 'one recovery email');
SELECT matches(
    (
        SELECT c.text_body FROM mailroom.claim_messages(10, 'tap') AS c
        ORDER BY c.id DESC LIMIT 1
    ),
    'https://app\.example\.test/recover\?token=[A-Za-z0-9_-]{86}\n.*enter the code [0-9]{5}\.',
    'recovery email: /recover link and the 5-digit code'
);

SELECT * FROM finish();
ROLLBACK;
