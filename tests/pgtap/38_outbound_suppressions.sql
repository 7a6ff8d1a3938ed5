-- Outbound: the suppression list (suppress, unsuppress, is_suppressed, list_suppressions), what
-- enqueue does with a suppressed recipient, token emails skipped, hard bounces from finalize.
BEGIN;
SELECT plan(51);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: the claim and the dequeue take rows made by then, the
-- test's alone (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);

-- the API
SELECT has_table('mailroom', 'suppressions', 'table suppressions');
SELECT col_is_unique('mailroom', 'suppressions', 'address', 'one entry per address');
SELECT is(
    (SELECT kind FROM mailroom.settings WHERE name = 'outbound.drop_suppressed_recipients'), 'boolean',
    'the drop setting has its kind (set_setting validates it)'
);
SELECT is(mailroom.setting('outbound.drop_suppressed_recipients'), 'false', 'default: refuse the message');
SELECT throws_ok(
    $$SELECT mailroom.suppress('not an address', 'manual')$$, 'MR350',
    'the address to suppress is not a valid email address', 'invalid address: MR350 without the value'
);
SELECT throws_ok($$SELECT mailroom.suppress(NULL, 'manual')$$, 'MR350', NULL, 'NULL address: MR350');
SELECT throws_ok(
    $$SELECT mailroom.suppress('x@example.com', 'spam')$$, 'MR351',
    'reason must be hard_bounce, complaint or manual, got ''spam''', 'unknown reason: MR351'
);
SELECT throws_ok(
    $$SELECT mailroom.suppress('x@example.com', 'manual', '1999-12-31Z')$$, 'MR352', NULL,
    'an expiry in the past: MR352'
);
SELECT throws_ok(
    $$SELECT mailroom.suppress('x@example.com', 'manual', 'infinity')$$, 'MR352', NULL, 'infinity: MR352'
);

SELECT ok(mailroom.suppress(' <Alice@Example.COM> ', 'manual') > 0, 'suppress returns the entry id');
SELECT is(
    (SELECT address FROM mailroom.suppressions WHERE lower(address) LIKE '%alice@example.com%'), 'alice@example.com',
    'stored in the inbound normalization (mailroom_internal._normalize_address)'
);
SELECT ok(mailroom.is_suppressed('ALICE@example.com'), 'is_suppressed normalizes too');
SELECT ok(NOT mailroom.is_suppressed('bob@example.com'), 'another address is not suppressed');
SELECT is(
    mailroom.suppress('alice@example.com', 'complaint'),
    (SELECT id FROM mailroom.suppressions WHERE address = 'alice@example.com'),
    'suppress again: the same entry'
);
SELECT is(
    (SELECT reason FROM mailroom.suppressions WHERE address = 'alice@example.com'), 'complaint',
    'an operator''s suppress updates the reason'
);
SELECT ok(mailroom.unsuppress('Alice@example.com'), 'unsuppress removes it');
SELECT ok(NOT mailroom.unsuppress('alice@example.com'), 'unsuppress of an absent address: false');
SELECT ok(NOT mailroom.is_suppressed('alice@example.com'), 'removed: no longer suppressed');

-- expiry (pinned clock)
SELECT mailroom.suppress('temp@example.com', 'manual', '2000-01-02Z');
SELECT ok(mailroom.is_suppressed('temp@example.com'), 'in force before expires_at');
SET LOCAL mailroom.clock = '2000-01-02 00:00Z';
SELECT ok(NOT mailroom.is_suppressed('temp@example.com'), 'no longer in force at expires_at');
SELECT lives_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['temp@example.com'], 's', 't')$$,
    'an expired suppression does not refuse the message'
);
SELECT is(
    (SELECT active FROM mailroom.list_suppressions(10) WHERE address = 'temp@example.com'), false,
    'list shows the expired entry as not active'
);
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
SELECT throws_ok($$SELECT * FROM mailroom.list_suppressions(0)$$, 'MR353', NULL, 'list limit 0: MR353');

-- enqueue: refuse (default)
SELECT mailroom.suppress('gone@example.com', 'hard_bounce');
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['ok@example.com', 'Gone@Example.com'], 's', 't')$$,
    'MR318', 'to[2] is on the suppression list', 'a suppressed recipient refuses the message, naming its position'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['ok@example.com'], 's', 't', p_bcc => ARRAY['gone@example.com'])$$,
    'MR318', 'bcc[1] is on the suppression list', 'bcc counts too'
);
-- enqueue: drop
SELECT mailroom.set_setting('outbound.drop_suppressed_recipients', 'true');
SELECT ok(
    mailroom.enqueue_message(
        'tap', ARRAY['ok@example.com', 'gone@example.com'], 'dropped', 't', p_cc => ARRAY['gone@example.com']
    ) > 0,
    'drop: the message is queued for the others'
);
SELECT is(
    (SELECT to_addrs || cc_addrs FROM mailroom.outbound_messages WHERE subject = 'dropped'),
    ARRAY['ok@example.com'], 'drop: only the other recipients are left'
);
SELECT is(
    (SELECT suppressed_recipients FROM mailroom.outbound_messages WHERE subject = 'dropped'),
    ARRAY['to[2]', 'cc[1]'], 'drop: the positions dropped are recorded, not the addresses'
);
SELECT is(
    (SELECT suppressed_recipients FROM mailroom.show_outbound_message(
        (SELECT id FROM mailroom.outbound_messages WHERE subject = 'dropped'))),
    ARRAY['to[2]', 'cc[1]'], 'show_outbound_message shows the positions dropped'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['gone@example.com'], 's', 't')$$,
    'MR318', 'every recipient is on the suppression list', 'drop: nobody left is refused'
);
SELECT mailroom.set_setting('outbound.drop_suppressed_recipients', 'false');

-- token emails: a suppressed account address is skipped and recorded, the batch goes on
SELECT mailroom.set_setting('collector.sender', 'tap');
SELECT mailroom.create_account('ann@example.test', 'ann');
SELECT mailroom.create_account('bob@example.test', 'bob');
SELECT mailroom.suppress('BOB@example.test', 'complaint');
SELECT is(
    mailroom.enqueue_token_emails(10, decode(repeat('ab', 32), 'hex')), 1,
    'token emails: the suppressed address is skipped, the other enqueued'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.suppressed_token_emails AS k
        INNER JOIN mailroom.tokens AS t ON k.token_id = t.id
        INNER JOIN mailroom.accounts AS a ON t.account = a.id
        WHERE a.login = 'bob'),
    1, 'the skip is recorded with the token id'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.outbound_messages WHERE 'bob@example.test' = ANY(to_addrs)),
    0, 'no email for bob'
);

-- finalize: a permanent reply to a single-recipient message is a hard bounce
SELECT mailroom.enqueue_message('tap', ARRAY['Bounce@Example.com'], 'single', 't');
SELECT mailroom.enqueue_message('tap', ARRAY['m1@example.com', 'm2@example.com'], 'multi', 't');
SELECT mailroom.enqueue_message('tap', ARRAY['soft@example.com'], 'soft', 't');
UPDATE mailroom.outbound_messages
SET next_retry_at = CASE WHEN subject IN ('single', 'multi', 'soft') THEN NULL ELSE '2099-01-01Z'::timestamptz END
WHERE status = 'queued' AND created_at <= mailroom.clock();
SELECT is((SELECT count(*)::integer FROM mailroom.claim_messages(10, 'tap')), 3, 'three claimed');
SELECT is(
    (SELECT array_agg(f.result ORDER BY f.id) FROM mailroom.finalize_messages(
        ARRAY(SELECT id FROM mailroom.outbound_messages WHERE claimed_by = 'tap' AND created_at <= mailroom.clock() ORDER BY id),
        ARRAY(SELECT claim_token FROM mailroom.outbound_messages WHERE claimed_by = 'tap' AND created_at <= mailroom.clock() ORDER BY id),
        ARRAY['reply', 'reply', 'reply'], ARRAY[550, 550, 451], ARRAY['5.1.1', '5.1.1', '4.2.0'],
        ARRAY['550 5.1.1 user unknown', '550 5.1.1 user unknown', '451 try later']
    ) AS f),
    ARRAY['failed', 'failed', 'retry'], 'finalize: two 5xx fail, a 4xx retries'
);
SELECT ok(mailroom.is_suppressed('bounce@example.com'), 'a 5xx to the only recipient suppresses it');
SELECT is(
    (SELECT reason || ' ' || (source_message = (SELECT id FROM mailroom.outbound_messages WHERE subject = 'single'))
        FROM mailroom.suppressions WHERE address = 'bounce@example.com'),
    'hard_bounce true', 'reason hard_bounce with the message id'
);
SELECT ok(
    NOT mailroom.is_suppressed('m1@example.com') AND NOT mailroom.is_suppressed('m2@example.com'),
    'multi-recipient 5xx: nobody is suppressed (the reply does not say who)'
);
SELECT ok(NOT mailroom.is_suppressed('soft@example.com'), 'a 4xx suppresses nobody');
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['bounce@example.com'], 's', 't')$$,
    'MR318', 'to[1] is on the suppression list', 'the next enqueue to the bounced address is refused'
);
-- a hard bounce does not override an entry in force; it replaces an expired one
SELECT mailroom.suppress('kept@example.com', 'complaint', '2000-06-01Z');
SELECT mailroom_internal._add_suppression('kept@example.com', 'hard_bounce', NULL, 42);
SELECT is(
    (SELECT reason || ' ' || coalesce(source_message::text, '-') FROM mailroom.suppressions WHERE address = 'kept@example.com'),
    'complaint -', 'a hard bounce leaves an entry in force alone'
);
SET LOCAL mailroom.clock = '2000-07-01 00:00Z';
SELECT mailroom_internal._add_suppression('kept@example.com', 'hard_bounce', NULL, 42);
SELECT is(
    (SELECT reason || ' ' || source_message || ' ' || (expires_at IS NULL) FROM mailroom.suppressions WHERE address = 'kept@example.com'),
    'hard_bounce 42 true', 'a hard bounce replaces an expired entry'
);
-- the API runs as its owner; list is bounded
SELECT ok(
    NOT EXISTS (
        SELECT 1 FROM pg_proc WHERE pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)
        AND proname IN ('suppress', 'unsuppress', 'is_suppressed', 'list_suppressions')
        AND NOT prosecdef
    ),
    'the suppression API runs as its owner'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.list_suppressions(100)),
    (SELECT count(*)::integer FROM mailroom.suppressions), 'list returns every entry within its limit'
);

-- issue 37: the list's test in one pass (_suppressed_flags: one HMAC batch, one probe) and the
-- one-address test (_suppressed, PL/pgSQL) answer what _suppression_id answers per address
SET LOCAL mailroom.clock = '2000-01-03 00:00Z';
SELECT mailroom.suppress('flag1@example.com', 'manual');
SELECT mailroom.suppress('later@example.com', 'manual', '2000-01-04Z');
SELECT mailroom.suppress('over@example.com', 'manual', '2000-01-03 12:00Z');
INSERT INTO mailroom.suppressions (address, reason, created_at)
VALUES (mailroom_internal._erased_form('erased-one@example.com'), 'manual', mailroom.clock());
SET LOCAL mailroom.clock = '2000-01-03 13:00Z';
SELECT is(
    mailroom_internal._suppressed_flags(ARRAY[
        'nobody@example.com', ' <FLAG1@example.com> ', 'erased-one@example.com', 'later@example.com',
        'over@example.com', NULL, 'not an address'
    ]),
    ARRAY[false, true, true, true, false, false, false],
    'flags, in order: normalized, the erased form, in force, expired, NULL and junk are not suppressed'
);
SELECT is(mailroom_internal._suppressed_flags('{}'), '{}'::boolean[], 'flags of an empty list: empty');
SELECT is(mailroom_internal._suppressed_flags(NULL), '{}'::boolean[], 'flags of NULL: empty');
SELECT is(
    (SELECT array_agg(mailroom_internal._suppressed(a) ORDER BY n)
     FROM unnest(ARRAY['nobody@example.com', 'FLAG1@example.com', 'erased-one@example.com', 'over@example.com', NULL])
        WITH ORDINALITY AS u (a, n)),
    (SELECT array_agg(mailroom_internal._suppression_id(a) IS NOT NULL ORDER BY n)
     FROM unnest(ARRAY['nobody@example.com', 'FLAG1@example.com', 'erased-one@example.com', 'over@example.com', NULL])
        WITH ORDINALITY AS u (a, n)),
    'the one-address test agrees with _suppression_id (normalized, erased form, expiry, NULL)'
);
SELECT is(
    mailroom_internal._suppressed_recipients(
        ARRAY['a@example.com', 'flag1@example.com'], ARRAY['erased-one@example.com'],
        ARRAY['b@example.com', 'later@example.com']
    ),
    ARRAY['to[2]', 'cc[1]', 'bcc[2]'],
    'positions over to, cc and bcc from one list: each counted within its own field'
);
SELECT is(
    mailroom_internal._suppressed_recipients(NULL, ARRAY['later@example.com'], NULL), ARRAY['cc[1]'],
    'positions with NULL fields'
);
SELECT is(
    mailroom_internal._without_suppressed(ARRAY['a@example.com', 'later@example.com', 'b@example.com']),
    ARRAY['a@example.com', 'b@example.com'], 'without the suppressed ones, in order'
);

SELECT * FROM finish();
ROLLBACK;
