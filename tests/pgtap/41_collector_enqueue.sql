-- Collector --enqueue: dequeue + render + enqueue_message in one transaction.
BEGIN;
SELECT plan(15);

SELECT mailroom.create_account('ann@example.test', 'ann');
SELECT mailroom.create_account('bob@example.test', 'bob');
SELECT mailroom.create_account('cyd@example.test', 'cyd');

-- errors first: each rolls back with its subtransaction, the tokens stay eligible
SELECT throws_ok(
    $$SELECT mailroom.enqueue_token_emails(10, decode(repeat('ab', 32), 'hex'))$$,
    'MR301', 'unknown sender ''mailroom''', 'no such sender: the outbound error, nothing dequeued'
);
-- written around set_setting (which may refuse it), as a value stored before validation would be
UPDATE mailroom.settings SET value = ' ' WHERE name = 'collector.sender';
SELECT throws_ok(
    $$SELECT mailroom.enqueue_token_emails(10, decode(repeat('ab', 32), 'hex'))$$,
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
    p_idempotency_key => 'token:' || (SELECT min(t.id) FROM mailroom.tokens AS t)
);
SELECT is(
    mailroom.enqueue_token_emails(2, decode(repeat('ab', 32), 'hex')), 2,
    'a full batch enqueues 2 emails (an application message keyed token:<id> takes none of them)'
);
SELECT is(mailroom.enqueue_token_emails(2, decode(repeat('ab', 32), 'hex')), 1, 'the rest: 1 email');
SELECT is(mailroom.enqueue_token_emails(2, decode(repeat('ab', 32), 'hex')), 0, 'then nothing is left');
SELECT is(
    (SELECT count(*)::integer FROM mailroom.dequeue_tokens(10, decode(repeat('ab', 32), 'hex'))), 0,
    'the tokens were dispatched in this transaction'
);

SELECT results_eq(
    $$SELECT to_addrs[1], subject, status::text FROM mailroom.outbound_messages
      WHERE idempotency_scope = 'mailroom' ORDER BY id$$,
    $$VALUES ('ann@example.test', 'Hi ann', 'queued'), ('bob@example.test', 'Hi bob', 'queued'),
             ('cyd@example.test', 'Hi cyd', 'queued')$$,
    'one queued message per token, in token order, rendered from the template'
);
SELECT ok(
    (SELECT bool_and(idempotency_key ~ '^token:[0-9]+$') FROM mailroom.outbound_messages WHERE idempotency_scope = 'mailroom'),
    'idempotency key is token:<id>, in scope mailroom'
);
SELECT is(
    (
        SELECT array_agg(idempotency_scope || ' ' || to_addrs[1] ORDER BY idempotency_scope)
        FROM mailroom.outbound_messages
        WHERE idempotency_key = 'token:' || (SELECT min(t.id) FROM mailroom.tokens AS t)
    ),
    ARRAY['app someone@example.test', 'mailroom ann@example.test'],
    'the application''s token:<id> message no longer suppresses the activation email with that key'
);
SELECT ok(
    (
        SELECT bool_and(text_body ~ 'https://app\.example\.test/activate\?token=[A-Za-z0-9_-]{86}\n')
        FROM mailroom.outbound_messages WHERE idempotency_scope = 'mailroom'
    ),
    'every text body carries an 86-character signed activation link'
);
SELECT ok(
    (
        SELECT bool_and(html_body LIKE '%<a href="https://app.example.test/activate?token=%')
        FROM mailroom.outbound_messages WHERE idempotency_scope = 'mailroom'
    ),
    'every HTML body links it'
);
SELECT is(
    (
        SELECT count(*)::integer
        FROM mailroom.outbound_messages AS m,
            LATERAL mailroom.consume_token(
                substring(m.text_body FROM 'token=([A-Za-z0-9_-]+)'), decode(repeat('ab', 32), 'hex')
            ) AS c
        WHERE m.id = (SELECT min(o.id) FROM mailroom.outbound_messages AS o WHERE o.idempotency_scope = 'mailroom')
    ),
    1,
    'the emailed link consumes with the same key'
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
SELECT mailroom.enqueue_token_emails(10, decode(repeat('ab', 32), 'hex'));
SELECT is(mailroom.enqueue_token_emails(10, decode(repeat('ab', 32), 'hex')), 1, 'one recovery email');
SELECT matches(
    (
        SELECT text_body FROM mailroom.outbound_messages
        ORDER BY id DESC LIMIT 1
    ),
    'https://app\.example\.test/recover\?token=[A-Za-z0-9_-]{86}\n.*enter the code [0-9]{5}\.',
    'recovery email: /recover link and the 5-digit code'
);

SELECT * FROM finish();
ROLLBACK;
