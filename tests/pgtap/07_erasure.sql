-- Foundation: erase_address removes or anonymizes one address everywhere and keeps it suppressed
-- by its keyed hash only; a dry run counts and changes nothing.
BEGIN;
SELECT plan(55);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: a claim takes rows made by then, the test's alone
-- (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
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
-- and one from a plus form of it (erasure finds alice+news@ too)
SELECT mailroom.deliver_message(
    :'box', convert_to(E'Subject: news\r\n\r\nnews\r\n', 'UTF8'), 'alice+news@example.com'
);

-- plus forms: alice@ also finds alice+news@ (mail to it is alice's), never malice+news@
SELECT ok('write to alice+news@example.com.' ~* mailroom_internal._address_pattern('alice@example.com'), 'the pattern finds a plus form');
SELECT ok(NOT 'malice+news@example.com' ~* mailroom_internal._address_pattern('alice@example.com'), 'not inside a longer local part');
SELECT ok(NOT 'alice@example.com' ~* mailroom_internal._address_pattern('alice+news@example.com'), 'an address with a tag: as written');
SELECT ok(mailroom_internal._is_address_form('<Alice+News@Example.com>', 'alice@example.com'), 'a recipient in a plus form is the address');
SELECT ok(NOT mailroom_internal._is_address_form('malice+news@example.com', 'alice@example.com'), 'another local part is not');

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
SELECT is((SELECT count(*)::int FROM mailroom.recovery_requests WHERE account = :alice OR email ILIKE '%alice@example.com%'), 0,
    'the recovery request is gone');
SELECT is((SELECT count(*)::int FROM mailroom.accounts WHERE id = :malice), 1, 'malice@ (holds alice@) stays');
SELECT is((SELECT count(*)::int FROM mailroom.outbound_messages WHERE id = :only), 0, 'mail to it alone is gone');
SELECT is(
    (SELECT to_addrs || cc_addrs FROM mailroom.outbound_messages WHERE id = :shared),
    ARRAY['bob@example.com', mailroom_internal._erased_recipient('ALICE@example.com'), 'malice@example.com'],
    'shared mail keeps the other recipients at their positions (the erased one in place, as a keyed hash)'
);
SELECT is(
    (SELECT text_body FROM mailroom.outbound_messages WHERE id = :shared), 'see malice@example.com',
    'another address holding it is not touched'
);
SELECT is(
    (SELECT subject FROM mailroom.outbound_messages WHERE id = :shared),
    'about ' || mailroom_internal._erased_form('alice@example.com'), 'the subject holds its erased form'
);
SELECT is(
    (SELECT headers ->> 'Reply-To' FROM mailroom.outbound_messages WHERE id = :shared),
    mailroom_internal._erased_form('alice@example.com'), 'a header too'
);
SELECT is(
    (SELECT idempotency_key FROM mailroom.outbound_messages WHERE id = :shared), NULL,
    'an idempotency key holding it is dropped'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.outbound_idempotency_keys WHERE key ILIKE '%alice@%'), 0,
    'and its row'
);
SELECT is((SELECT count(*)::int FROM mailroom.messages WHERE mailbox_id = (SELECT id FROM mailroom.mailboxes WHERE address = :'box')), 0,
    'the inbox message from it is gone');
SELECT is(
    (SELECT reason FROM mailroom.suppressions WHERE address = mailroom_internal._erased_form('alice@example.com')),
    'complaint', 'the suppression keeps its reason under the keyed hash'
);
SELECT is((SELECT count(*)::int FROM mailroom.suppressions WHERE address LIKE '%alice%'), 0, 'no address left in it');
SELECT ok(mailroom.is_suppressed('Alice@example.com'), 'is_suppressed still answers true');
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['alice@example.com'], 's', 't')$$, 'MR318', NULL,
    'enqueue still refuses it'
);
SELECT ok(
    mailroom_internal._erased_form('alice@example.com') ~ '^erased:[0-9a-f]{64}$', 'the erased form: a keyed hash, no @'
);
SELECT lives_ok($$SELECT * FROM mailroom.erase_address('alice@example.com')$$, 'erasing twice is harmless');
SELECT ok(mailroom.unsuppress('alice@example.com'), 'unsuppress removes the erased entry');

-- Positions stable under erasure (issue 34): a return path or unsubscribe link names an envelope
-- position; erasing one recipient keeps the others' positions, and a claim skips the erased one.
SELECT mailroom.set_setting('outbound.bounce_domain', 'bounces.mailroom.test');
SELECT mailroom.set_setting('outbound.unsubscribe_base_url', 'https://mail.mailroom.test');
SELECT mailroom.enqueue_bulk_message(
    'tap', ARRAY['Dora@example.org', 'bob@example.org'], 'news', 'b', p_cc => ARRAY['carol@example.org']
) AS news \gset
CREATE TEMP TABLE signed AS
SELECT
    n AS pos,
    substring(c.list_unsubscribe[n] FROM '/unsubscribe/([0-9]+-[0-9]+-[0-9a-f]{16})>') AS token,
    c.return_paths[n] AS path
FROM mailroom.claim_messages(100, 'tap') AS c
CROSS JOIN generate_series(1, 3) AS n
WHERE c.id = :news;
SELECT mailroom.release_messages(array_agg(id), array_agg(claim_token))
FROM mailroom.outbound_messages WHERE status = 'processing' AND created_at <= mailroom.clock();
SELECT is((SELECT count(*)::int FROM signed WHERE token IS NOT NULL AND path IS NOT NULL), 3, 'three signed recipients');
SELECT * FROM mailroom.erase_address('dora@example.org');
SELECT ok(
    (SELECT to_addrs[1] ~ '^erased:[0-9a-f]{64}$' AND to_addrs[2] = 'bob@example.org' AND cc_addrs = ARRAY['carol@example.org']
     FROM mailroom.outbound_messages WHERE id = :news),
    'the erased recipient is replaced in place: the others keep their positions'
);
SELECT is(
    (SELECT g.address FROM mailroom_internal._signed_recipient((SELECT token FROM signed WHERE pos = 2)) AS g), 'bob@example.org',
    'bob''s link still names bob'
);
SELECT is(
    (SELECT g.address FROM mailroom_internal._signed_recipient((SELECT token FROM signed WHERE pos = 3)) AS g), 'carol@example.org',
    'carol''s link still names carol'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom_internal._signed_recipient((SELECT token FROM signed WHERE pos = 1))), 0,
    'the erased recipient''s link names nobody'
);
SELECT is(
    (SELECT r.outcome FROM mailroom.record_bounce(
        (SELECT path FROM signed WHERE pos = 2),
        '[{"recipient": "carol@example.org", "action": "failed", "status": "5.1.1"}]'
    ) AS r),
    'ignored', 'bob''s return path cannot hard-bounce carol'
);
SELECT ok(mailroom.unsubscribe((SELECT token FROM signed WHERE pos = 2), 'One-Click'), 'bob''s link unsubscribes');
SELECT ok(
    mailroom.is_suppressed('bob@example.org') AND NOT mailroom.is_suppressed('carol@example.org'),
    'bob is suppressed, carol is not'
);
SELECT ok(mailroom.unsubscribe((SELECT token FROM signed WHERE pos = 3), 'One-Click'), 'carol''s link works (no MR380)');
SELECT throws_ok(
    format('SELECT mailroom.unsubscribe(%L, ''One-Click'')', (SELECT token FROM signed WHERE pos = 1)), 'MR380', NULL,
    'the erased recipient''s link: MR380'
);
CREATE TEMP TABLE after_erasure AS
SELECT c.to_addrs, c.cc_addrs, c.recipients, c.return_paths, c.list_unsubscribe
FROM mailroom.claim_messages(100, 'tap') AS c WHERE c.id = :news;
SELECT is(
    (SELECT recipients FROM after_erasure), ARRAY['bob@example.org', 'carol@example.org'],
    'a claim skips the erased position: never sent to it'
);
SELECT ok(
    (SELECT return_paths[1] ~ ('^bounce\+' || :news || '-2-') AND return_paths[2] ~ ('^bounce\+' || :news || '-3-')
        AND list_unsubscribe[1] ~ ('/' || :news || '-2-') AND cardinality(list_unsubscribe) = 2
     FROM after_erasure),
    'each remaining recipient gets the return path and link of its own position'
);
SELECT is(
    (SELECT to_addrs || cc_addrs FROM after_erasure), ARRAY['bob@example.org', 'carol@example.org'],
    'the headers name no erased recipient'
);

-- two spellings of one address are two envelope positions: both erased, both stay positions
SELECT mailroom.enqueue_message('tap', ARRAY['Eve@example.org', 'eve@example.org', 'zed@example.org'], 's', 't') AS eve \gset
SELECT * FROM mailroom.erase_address('eve@example.org');
SELECT ok(
    (SELECT cardinality(mailroom_internal._envelope(to_addrs, cc_addrs, bcc_addrs)) = 3 AND to_addrs[1] <> to_addrs[2]
     FROM mailroom.outbound_messages WHERE id = :eve),
    'two spellings erased: two distinct placeholders, the envelope keeps three positions'
);
SELECT ok(
    (SELECT c.recipients = ARRAY['zed@example.org'] AND c.return_paths[1] ~ ('^bounce\+' || :eve || '-3-')
     FROM mailroom.claim_messages(100, 'tap') AS c WHERE c.id = :eve),
    'the one left keeps position 3'
);

-- An address only inside decoded parts (issue 34): a base64 attachment, a quoted-printable body
-- with a soft line break in the address, an encoded word of a header. Each message goes; one
-- whose base64 holds a longer address (xdora.victim@) stays. And idempotency keys: a key holding
-- the address anywhere (idem-dora.victim@…: '-' belongs to a local part) is dropped.
SELECT address AS box2 FROM mailroom.create_mailbox(60, 'free') \gset
SELECT mailroom.deliver_message(:'box2', convert_to(m.raw, 'UTF8'), 'someone@example.com', split_part(split_part(m.raw, E'Subject: ', 2), E'\r', 1))
FROM unnest(ARRAY[
    E'From: a@example.net\r\nSubject: b64\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="b"\r\n\r\n'
    || E'--b\r\nContent-Type: text/plain\r\n\r\nsee the file\r\n--b\r\nContent-Type: text/csv; name="c.csv"\r\n'
    || E'Content-Transfer-Encoding: base64\r\n\r\nbmFtZSxlbWFpbA0KRG9yYSxkb3JhLnZpY3RpbUB2aWN0aW0udGVzdA0KbmFtZSxlbWFpbA0KRG9y\r\nYSxkb3JhLnZpY3RpbUB2aWN0aW0udGVzdA0KbmFtZSxlbWFpbA0KRG9yYSxkb3JhLnZpY3RpbUB2\r\naWN0aW0udGVzdA0K\r\n--b--\r\n',
    E'From: a@example.net\r\nSubject: qp\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n'
    || E'write to dora.vic=\r\ntim=40victim.test today\r\n',
    E'From: a@example.net\r\nReply-To: =?utf-8?B?ZG9yYS52aWN0aW1AdmljdGltLnRlc3Q=?= <r@example.net>\r\nSubject: ew\r\n\r\nhi\r\n',
    E'From: a@example.net\r\nSubject: control\r\nContent-Transfer-Encoding: base64\r\n\r\nY29udGFjdDogeGRvcmEudmljdGltQHZpY3RpbS50ZXN0DQo=\r\n'
]) AS m (raw);
SELECT is((SELECT count(*)::int FROM mailroom.messages WHERE mailbox_id = (SELECT id FROM mailroom.mailboxes WHERE address = :'box2')), 4, 'four messages stored');
SELECT mailroom.enqueue_message(
    'tap', ARRAY['other@example.org', 'dora.victim@victim.test'], 's', 't', p_idempotency_key => 'idem-dora.victim@victim.test'
) AS idem \gset
SELECT mailroom.enqueue_message(
    'tap', ARRAY['other@example.org'], 's', 't', p_idempotency_key => 'IDEM-DORA.VICTIM@VICTIM.TEST-2'
) AS idem2 \gset
SELECT * FROM mailroom.erase_address('dora.victim@victim.test');
SELECT is(
    (SELECT array_agg(subject ORDER BY subject) FROM mailroom.messages
     WHERE mailbox_id = (SELECT id FROM mailroom.mailboxes WHERE address = :'box2')),
    ARRAY['control'], 'an address only in a base64 part, a quoted-printable body or an encoded word: found, the message gone'
);
SELECT is(
    (SELECT array_agg(idempotency_key) FROM mailroom.outbound_messages WHERE id IN (:idem, :idem2)), ARRAY[NULL, NULL]::text[],
    'idempotency keys holding the address anywhere are dropped'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.outbound_idempotency_keys WHERE key ILIKE '%dora.victim@%'), 0, 'and their rows'
);

-- A 5xx to a message whose one live recipient is left after an erasure is that recipient's hard bounce
-- (finalize counts live positions, not array elements: the erased one keeps its place, never mailed)
SELECT mailroom.enqueue_message('tap', ARRAY['gone.one@example.org', 'left.one@example.org'], 's', 't') AS pair \gset
SELECT * FROM mailroom.erase_address('gone.one@example.org');
SELECT c.claim_token AS pair_claim FROM mailroom.claim_messages(1000, 'tap') AS c WHERE c.id = :pair \gset
SELECT * FROM mailroom.finalize_messages(ARRAY[:pair]::bigint[], ARRAY[:pair_claim]::bigint[], ARRAY['reply'], ARRAY[550], ARRAY['5.1.1']);
SELECT ok(mailroom.is_suppressed('left.one@example.org'), 'the live recipient of a 5xx after an erasure is suppressed');

-- Webhook endpoints of an erased owner (sql/38): their owner is renamed with their key's, so the mail
-- of a later owner of the same id (a new key for the address) never reaches the erased owner's
-- endpoint; an endpoint whose URL holds the address goes; a sender's endpoint holding it is the
-- operator's configuration (MR007)
\ir fixtures/sender_key.sql
SELECT mailroom.set_sender_public_key((SELECT public_key FROM sender_key));
SELECT mailroom.create_api_key('carol.owner@victim.test', sha256('mrk_tap_erase_carol'::bytea)) AS carol_key \gset
SELECT a.id AS carol_hook
FROM mailroom.add_webhook('https://hooks.example.com/c', ARRAY['message.received'], :carol_key) AS a \gset
SELECT a.id AS carol_url_hook
FROM mailroom.add_webhook('https://hooks.example.com/u;carol.owner@victim.test', ARRAY['message.received'], :carol_key) AS a \gset
SELECT * FROM mailroom.erase_address('carol.owner@victim.test');
SELECT is(
    (SELECT owner_id FROM mailroom.webhook_endpoints WHERE id = :carol_hook),
    (SELECT owner_id FROM mailroom.api_keys WHERE id = :carol_key),
    'an erased owner''s webhook endpoint is renamed with its key'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.webhook_endpoints WHERE id = :carol_url_hook), 0,
    'a webhook endpoint whose URL holds the erased address goes'
);
SELECT mailroom.create_api_key('carol.owner@victim.test', sha256('mrk_tap_erase_carol_later'::bytea));
SELECT address AS carol_box FROM mailroom.create_mailbox(60, 'free', 'api', 'carol.owner@victim.test') \gset
SELECT mailroom.deliver_message(:'carol_box', convert_to(E'Subject: later\r\n\r\nx\r\n', 'UTF8'), 'a@example.net', 'later');
SELECT is(
    (SELECT count(*)::int FROM mailroom.outbound_messages WHERE kind = 'webhook' AND webhook_endpoint_id = :carol_hook), 0,
    'a later owner of the same id: none of its mail reaches the erased owner''s endpoint'
);
SELECT * FROM mailroom.add_webhook('https://hooks.example.com/s;dan.op@victim.test', ARRAY['message.sent'], p_sender => 'tap');
SELECT throws_ok(
    $$SELECT * FROM mailroom.erase_address('dan.op@victim.test')$$, 'MR007', NULL,
    'an address in a sender''s webhook endpoint is configuration: MR007'
);

SELECT * FROM finish();
ROLLBACK;
