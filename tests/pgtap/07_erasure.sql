-- Foundation: erase_address removes or anonymizes one address everywhere and keeps it suppressed
-- by its keyed hash only; a dry run counts and changes nothing.
BEGIN;
SELECT plan(26);

SET LOCAL mailroom.clock = '2030-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);

SELECT throws_ok(
    $$SELECT * FROM mailroom.erase_address('not an address')$$, 'MR006',
    'the address to erase is not a valid email address', 'a bad address: MR006 without the value'
);
SELECT throws_ok($$SELECT * FROM mailroom.erase_address(NULL)$$, 'MR006', NULL, 'NULL: MR006');
SELECT throws_ok(
    $$SELECT * FROM mailroom.erase_address('Robot@Mailroom.test')$$, 'MR007',
    'the address to erase is in the configuration (sender tap): change it first',
    'a sender''s From address: MR007 names the sender, not the address'
);

-- the address in an account (its token), a recovery request, outbound mail alone and with others,
-- a suppression, an inbox message; and a neighbour that must stay (malice@ holds alice@)
SELECT mailroom.create_account('Alice@Example.com', 'alice') AS alice \gset
SELECT mailroom.create_account('malice@example.com', 'malice') AS malice \gset
SELECT mailroom.request_password_recovery('alice@example.com');
SELECT mailroom.enqueue_message('tap', ARRAY['alice@example.com'], 'hello Alice', 'write to alice@example.com.') AS only \gset
SELECT mailroom.enqueue_message(
    'tap', ARRAY['bob@example.com', 'ALICE@example.com'], 'about alice@example.com', 'see malice@example.com',
    p_cc => ARRAY['malice@example.com'], p_headers => '{"Reply-To": "alice@example.com"}',
    p_idempotency_key => 'welcome:alice@example.com'
) AS shared \gset
SELECT mailroom.suppress('alice@example.com', 'complaint');
SELECT address AS box FROM mailroom.create_mailbox(60, 'free') \gset
SELECT mailroom.deliver_message(
    :'box',
    convert_to(E'From: Alice <ALICE@EXAMPLE.COM>\r\nSubject: hi\r\n\r\nhi\r\n', 'UTF8'), 'alice@example.com'
);

SELECT set_eq(
    $$SELECT item FROM mailroom.erase_address('alice@example.com', p_dry_run => true) WHERE affected > 0$$,
    ARRAY[
        'accounts', 'messages', 'outbound_messages_deleted', 'outbound_messages_rewritten',
        'recovery_requests', 'suppressions', 'tokens'
    ],
    'a dry run counts what it would change'
);
SELECT is((SELECT count(*)::int FROM mailroom.accounts WHERE lower(email) = 'alice@example.com'), 1, 'dry run: the account stays');
SELECT is((SELECT count(*)::int FROM mailroom.suppressions WHERE address = 'alice@example.com'), 1, 'dry run: the entry stays');

SELECT is(
    (SELECT affected FROM mailroom.erase_address('<Alice@Example.COM>') WHERE item = 'accounts'), 1::bigint,
    'erase: one account'
);
SELECT is((SELECT count(*)::int FROM mailroom.accounts WHERE id = :alice), 0, 'the account is gone');
SELECT is((SELECT count(*)::int FROM mailroom.tokens WHERE account = :alice), 0, 'its tokens are gone');
SELECT is((SELECT count(*)::int FROM mailroom.recovery_requests), 0, 'the recovery request is gone');
SELECT is((SELECT count(*)::int FROM mailroom.accounts WHERE id = :malice), 1, 'malice@ (holds alice@) stays');
SELECT is((SELECT count(*)::int FROM mailroom.outbound_messages WHERE id = :only), 0, 'mail to it alone is gone');
SELECT is(
    (SELECT to_addrs || cc_addrs FROM mailroom.outbound_messages WHERE id = :shared),
    ARRAY['bob@example.com', 'malice@example.com'], 'shared mail keeps the other recipients'
);
SELECT is(
    (SELECT text_body FROM mailroom.outbound_messages WHERE id = :shared), 'see malice@example.com',
    'another address holding it is not touched'
);
SELECT is(
    (SELECT subject FROM mailroom.outbound_messages WHERE id = :shared),
    'about ' || mailroom._erased_form('alice@example.com'), 'the subject holds its erased form'
);
SELECT is(
    (SELECT headers ->> 'Reply-To' FROM mailroom.outbound_messages WHERE id = :shared),
    mailroom._erased_form('alice@example.com'), 'a header too'
);
SELECT is(
    (SELECT idempotency_key FROM mailroom.outbound_messages WHERE id = :shared), NULL,
    'an idempotency key holding it is dropped'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.outbound_idempotency_keys WHERE key ILIKE '%alice@%'), 0,
    'and its row'
);
SELECT is((SELECT count(*)::int FROM mailroom.messages), 0, 'the inbox message from it is gone');
SELECT is(
    (SELECT reason FROM mailroom.suppressions WHERE address = mailroom._erased_form('alice@example.com')),
    'complaint', 'the suppression keeps its reason under the keyed hash'
);
SELECT is((SELECT count(*)::int FROM mailroom.suppressions WHERE address LIKE '%alice%'), 0, 'no address left in it');
SELECT ok(mailroom.is_suppressed('Alice@example.com'), 'is_suppressed still answers true');
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['alice@example.com'], 's', 't')$$, 'MR318', NULL,
    'enqueue still refuses it'
);
SELECT ok(
    mailroom._erased_form('alice@example.com') ~ '^erased:[0-9a-f]{64}$', 'the erased form: a keyed hash, no @'
);
SELECT lives_ok($$SELECT * FROM mailroom.erase_address('alice@example.com')$$, 'erasing twice is harmless');
SELECT ok(mailroom.unsuppress('alice@example.com'), 'unsuppress removes the erased entry');

SELECT * FROM finish();
ROLLBACK;
