-- Bounces (sql/36_outbound_bounces.sql): VERP return paths from claim_messages, one per recipient, their
-- signature checked at RCPT (check_bounce_recipient), and what record_bounce decides for each kind of
-- report: only about the return path's own recipient, at most once.
BEGIN;
SELECT plan(84);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: a claim takes rows made by then, the test's alone
-- (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);
SELECT mailroom.upsert_sender('own', 'robot@mailroom.test', '127.0.0.1', 2525);

CREATE TEMP TABLE m AS
SELECT
    mailroom.enqueue_message('tap', ARRAY['Gone@Example.com', 'ok@example.com'], 's1', 'b') AS a,
    mailroom.enqueue_message('tap', ARRAY['late@example.com'], 's2', 'b') AS b,
    mailroom.enqueue_message('own', ARRAY['x@example.com'], 's3', 'b', NULL, ARRAY['cc@example.com']) AS c;

-- the key and the setting
SELECT has_table('mailroom', 'verp_key', 'table verp_key');
SELECT is((SELECT octet_length(key) FROM mailroom.verp_key), 32, 'the VERP key: 32 random bytes');
SELECT is(mailroom.setting('outbound.bounce_domain'), '', 'default: no bounce domain');
SELECT is(
    (SELECT kind FROM mailroom.settings WHERE name = 'outbound.bounce_domain'), 'text',
    'the setting has a kind (set_setting checks it)'
);

-- VERP off without a bounce domain: claim returns NULL and the sender keeps from_address
SELECT is(
    (SELECT count(*)::integer FROM mailroom.claim_messages(10, 'w1') WHERE return_path IS NULL AND return_paths IS NULL), 3,
    'no bounce domain: return_path and return_paths are NULL for every claimed message'
);
SELECT mailroom.release_messages(array_agg(id), array_agg(claim_token))
FROM mailroom.outbound_messages WHERE status = 'processing' AND created_at <= mailroom.clock();
SELECT is(mailroom_internal._return_path((SELECT a FROM m), 1), NULL, '_return_path is NULL without a domain');
SELECT mailroom.set_setting('outbound.bounce_domain', 'not a domain');
SELECT is(
    mailroom_internal._return_path((SELECT a FROM m), (SELECT id FROM mailroom.senders WHERE name = 'tap')), NULL,
    'a setting that is not a domain name: no VERP'
);

-- VERP on: the setting for every sender, a sender's own column first
SELECT mailroom.set_setting('outbound.bounce_domain', 'Bounces.Mailroom.test');
SELECT mailroom.set_sender_bounce_domain('own', 'b2.example.org');
CREATE TEMP TABLE claimed AS SELECT id, return_path, recipients, return_paths FROM mailroom.claim_messages(10, 'w2');
SELECT is(
    (SELECT return_paths FROM claimed WHERE id = (SELECT a FROM m)),
    ARRAY(
        SELECT 'bounce+' || (SELECT a FROM m) || '-' || n || '-' || mailroom_internal._recipient_signature(
            'mailroom-verp', (SELECT a FROM m), n, (SELECT key FROM mailroom.verp_key)
        ) || '@bounces.mailroom.test'
        FROM generate_series(1, 2) AS n
    ),
    'return_paths = bounce+<id>-<recipient>-<signature>@<setting, lower case>, one per recipient'
);
SELECT is(
    (SELECT recipients FROM claimed WHERE id = (SELECT c FROM m)), ARRAY['x@example.com', 'cc@example.com'],
    'recipients: the envelope (to, cc, bcc), in the order of return_paths'
);
SELECT matches(
    (SELECT return_paths[2] FROM claimed WHERE id = (SELECT a FROM m)), '^bounce\+[0-9]+-2-[0-9a-f]{16}@',
    'the signature: 16 hex characters'
);
SELECT isnt(
    (SELECT return_paths[1] FROM claimed WHERE id = (SELECT a FROM m)),
    (SELECT return_paths[2] FROM claimed WHERE id = (SELECT a FROM m)),
    'each recipient has its own return path'
);
SELECT is(
    (SELECT return_path FROM claimed WHERE id = (SELECT a FROM m)), NULL,
    'return_path (one transaction for all, a sender of the previous release): NULL with several recipients'
);
SELECT is(
    (SELECT return_path FROM claimed WHERE id = (SELECT b FROM m)), (SELECT return_paths[1] FROM claimed WHERE id = (SELECT b FROM m)),
    'return_path with one recipient: that recipient''s'
);
SELECT is(
    (SELECT split_part(return_paths[1], '@', 2) FROM claimed WHERE id = (SELECT c FROM m)), 'b2.example.org',
    'a sender''s bounce_domain wins over the setting'
);
SELECT isnt(
    mailroom_internal._verp_signature((SELECT a FROM m)), mailroom_internal._verp_signature((SELECT b FROM m)),
    'each message has its own signature'
);
SELECT throws_ok(
    $$SELECT mailroom.set_sender_bounce_domain('own', 'bad domain')$$, 'MR362', NULL, 'a bad domain: MR362'
);
SELECT throws_ok(
    $$SELECT mailroom.set_sender_bounce_domain('nobody', 'x.example')$$, 'MR363', NULL, 'unknown sender: MR363'
);

CREATE TEMP TABLE rp AS
SELECT
    (SELECT return_paths[1] FROM claimed WHERE id = (SELECT a FROM m)) AS a,
    (SELECT return_paths[2] FROM claimed WHERE id = (SELECT a FROM m)) AS a2,
    (SELECT return_paths[1] FROM claimed WHERE id = (SELECT b FROM m)) AS b,
    (SELECT return_paths[1] FROM claimed WHERE id = (SELECT c FROM m)) AS c,
    (SELECT return_paths[2] FROM claimed WHERE id = (SELECT c FROM m)) AS c2,
    'bounce+' || (SELECT a FROM m) || '-' || mailroom_internal._verp_signature((SELECT a FROM m)) || '@bounces.mailroom.test' AS legacy_a,
    'bounce+' || (SELECT b FROM m) || '-' || mailroom_internal._verp_signature((SELECT b FROM m)) || '@bounces.mailroom.test' AS legacy_b;

-- RCPT: the signature is checked
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient((SELECT a FROM rp))), 'bounce', 'a valid return path: bounce'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('<' || upper((SELECT a FROM rp)) || '>')), 'bounce',
    'case-folded and in brackets: still valid (the signature is lower-case hex)'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient((SELECT c FROM rp))), 'bounce',
    'a return path on a sender''s own domain: bounce'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient(
        regexp_replace((SELECT a FROM rp), '-[0-9a-f]{16}@', '-aaaaaaaaaaaaaaaa@')
    )),
    'unknown', 'a bad signature: unknown'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient(replace((SELECT a FROM rp), '-1-', '-2-'))),
    'unknown', 'another recipient''s position under this signature: unknown'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient(
        'bounce+' || (SELECT a FROM m) || '-3-' || mailroom_internal._recipient_signature(
            'mailroom-verp', (SELECT a FROM m), 3, (SELECT key FROM mailroom.verp_key)
        ) || '@bounces.mailroom.test'
    )),
    'unknown', 'a signed position the message does not have: unknown'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient((SELECT legacy_a FROM rp))), 'bounce',
    'the message-level return path of the previous release: still accepted (mail already sent bounces)'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient(
        'bounce+' || (SELECT b FROM m) || '-' || mailroom_internal._verp_signature((SELECT a FROM m)) || '@bounces.mailroom.test'
    )),
    'unknown', 'another message''s signature: unknown'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient(
        'bounce+999999-' || mailroom_internal._verp_signature(999999) || '@bounces.mailroom.test'
    )),
    'unknown', 'a right signature for a message that does not exist: unknown'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient(replace((SELECT a FROM rp), 'bounces.mailroom.test', 'other.test'))),
    'unknown', 'a return path on a domain that is no bounce domain: check_recipient''s unknown'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('bounce+garbage@bounces.mailroom.test')), 'unknown',
    'anything else at bounce+ on a bounce domain: unknown'
);
CREATE TEMP TABLE box AS SELECT address FROM mailroom.create_mailbox(NULL, 'free', 'anonymous', NULL);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient((SELECT address FROM box))),
    'ok', 'a mailbox address: check_recipient''s verdict'
);

-- record_bounce: what a report means
SELECT throws_ok(
    format('SELECT * FROM mailroom.record_bounce(%L, %L)', regexp_replace((SELECT a FROM rp), '-[0-9a-f]+@', '-bbbbbbbbbbbbbbbb@'), '[]'),
    'MR360', NULL, 'a forged return path: MR360'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.record_bounce(%L, %L)', (SELECT a FROM rp), '{}'), 'MR361', NULL,
    'reports must be an array: MR361'
);

SELECT results_eq(
    format(
        'SELECT outcome, reports, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT b FROM rp),
        '[{"recipient": "late@example.com", "action": "delayed", "status": "4.4.1", "diagnostic": "smtp; 451 4.4.1 try later"}]'
    ),
    $$VALUES ('delayed', 1, 0)$$, 'Action: delayed is noted'
);
SELECT ok(NOT mailroom.is_suppressed('late@example.com'), 'delayed: no suppression');
SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT b FROM rp),
        '[{"recipient": "late@example.com", "action": "failed", "status": "4.4.7", "diagnostic": "smtp; 421 expired"}]'
    ),
    $$VALUES ('soft_bounce', 0)$$, 'Action: failed with a 4.x.x status is a soft bounce'
);
SELECT ok(NOT mailroom.is_suppressed('late@example.com'), 'a soft bounce: no suppression');

SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT a FROM rp),
        '[{"recipient": "stranger@example.com", "action": "failed", "status": "5.1.1"}]'
    ),
    $$VALUES ('ignored', 0)$$, 'a recipient the message did not have is ignored'
);
SELECT ok(NOT mailroom.is_suppressed('stranger@example.com'), 'a forged report suppresses nobody');

SELECT results_eq(
    format(
        'SELECT message_id, outcome, reports, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT a FROM rp),
        '[{"recipient": "gone@example.com", "action": "failed", "status": "5.1.1",'
        || ' "diagnostic": "smtp; 550 5.1.1 <gone@example.com>: user unknown"},'
        || ' {"recipient": "ok@example.com", "action": "failed", "status": "5.1.1"}]'
    ),
    format('VALUES (%s::bigint, %L, 2, 1)', (SELECT a FROM m), 'hard_bounce'),
    'Action: failed with 5.x.x: a hard bounce of the return path''s recipient; the other recipient named: ignored'
);
SELECT results_eq(
    $$SELECT address, reason, source_message, expires_at FROM mailroom.suppressions WHERE address LIKE 'gone@%'$$,
    format('VALUES (%L, %L, %s::bigint, NULL::timestamptz)', 'gone@example.com', 'hard_bounce', (SELECT a FROM m)),
    'the recipient is suppressed: hard_bounce, source message = the bounced message, no expiry'
);
SELECT ok(NOT mailroom.is_suppressed('ok@example.com'), 'the other recipient of the message is not suppressed');
-- issue 21, item 2: a recipient sends a DSN naming the others to its own return path
SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT a2 FROM rp),
        '[{"recipient": "gone@example.com", "action": "failed", "status": "5.1.1"},'
        || ' {"recipient": "cc@example.com", "action": "failed", "status": "5.1.1"}]'
    ),
    $$VALUES ('ignored', 0)$$, 'a DSN to one recipient''s return path naming the others: ignored'
);
SELECT ok(NOT mailroom.is_suppressed('cc@example.com'), 'nobody else suppressed');
SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT legacy_a FROM rp),
        '[{"recipient": "ok@example.com", "action": "failed", "status": "5.1.1"}]'
    ),
    $$VALUES ('ignored', 0)$$, 'the message-level return path of a message with several recipients suppresses nobody'
);
SELECT ok(NOT mailroom.is_suppressed('ok@example.com'), 'ok@ is still not suppressed');
-- a return path suppresses at most once: the admin removes the entry, the DSN is replayed
SELECT mailroom.unsuppress('gone@example.com');
SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT a FROM rp),
        '[{"recipient": "gone@example.com", "action": "failed", "status": "5.1.1"}]'
    ),
    $$VALUES ('spent', 0)$$, 'a replayed DSN after an admin unsuppressed: spent, nothing suppressed'
);
SELECT ok(NOT mailroom.is_suppressed('gone@example.com'), 'the unsuppressed address stays unsuppressed');
SELECT mailroom.suppress('gone@example.com', 'hard_bounce', NULL, (SELECT a FROM m));
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['gone@example.com'], 'again', 'b')$$, 'MR318', NULL,
    'the next enqueue to the bounced address is refused'
);
SELECT results_eq(
    format('SELECT outcome, recipient, status FROM mailroom.outbound_bounces WHERE message_id = %s ORDER BY id', (SELECT a FROM m)),
    $$VALUES ('ignored', NULL, '5.1.1'), ('hard_bounce', 'to[1]', '5.1.1'), ('ignored', NULL, '5.1.1'),
        ('ignored', NULL, '5.1.1'), ('ignored', NULL, '5.1.1'), ('ignored', NULL, '5.1.1'), ('spent', 'to[1]', '5.1.1')$$,
    'every report is kept, the recipient as its position'
);
SELECT ok(
    (SELECT bool_and(diagnostic NOT LIKE '%@%') FROM mailroom.outbound_bounces WHERE diagnostic IS NOT NULL),
    'diagnostics are redacted (no address)'
);
SELECT matches(
    (SELECT error_log FROM mailroom.outbound_messages WHERE id = (SELECT a FROM m)),
    'bounce hard_bounce to\[1\] failed 5\.1\.1', 'the hard bounce is noted in the message''s error_log'
);
SELECT doesnt_match(
    (SELECT error_log FROM mailroom.outbound_messages WHERE id = (SELECT a FROM m)), '@',
    'error_log names no address'
);

SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT c2 FROM rp),
        '[{"recipient": "rfc822;CC@example.com", "action": "failed", "smtp_code": "550"}]'
    ),
    $$VALUES ('ignored', 0)$$, 'the recipient is an address, not an address type: rfc822;… is nobody'
);
SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT c2 FROM rp),
        '[{"recipient": "<CC@example.com>", "action": "failed", "smtp_code": "550"}]'
    ),
    $$VALUES ('hard_bounce', 1)$$, 'failed with a 5yz code and no status: hard (a cc recipient too)'
);
SELECT is(
    (SELECT recipient FROM mailroom.outbound_bounces WHERE message_id = (SELECT c FROM m) ORDER BY id DESC LIMIT 1),
    'cc[1]', 'the cc recipient''s position'
);
SELECT results_eq(
    format('SELECT outcome, reports, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT c FROM rp), '[]'),
    $$VALUES ('unparsed', 1, 0)$$, 'nothing parsed: recorded as unparsed'
);
SELECT matches(
    (SELECT error_log FROM mailroom.outbound_messages WHERE id = (SELECT c FROM m)), 'bounce unparsed$',
    'unparsed is noted on the message'
);

SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT c FROM rp),
        '[{"recipient": "x@example.com", "action": "failed <x@example.com>", "status": "5.1.1"}, "not an object"]'
    ),
    $$VALUES ('other', 0)$$, 'an action that is not one word is no action: noted as other, nobody suppressed'
);
SELECT is(
    (SELECT action FROM mailroom.outbound_bounces WHERE message_id = (SELECT c FROM m) ORDER BY id DESC LIMIT 1),
    NULL, 'and it is not stored'
);

-- an ARF complaint at a return path: its recipient, reason complaint, once
SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT legacy_b FROM rp),
        '[{"feedback_type": "abuse", "signed": []}]'
    ),
    $$VALUES ('complaint', 1)$$, 'an ARF abuse report at the (single-recipient) return path: complaint'
);
SELECT is(
    (SELECT reason FROM mailroom.suppressions WHERE address = 'late@example.com'), 'complaint',
    'the recipient is suppressed with reason complaint'
);
SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT b FROM rp),
        '[{"feedback_type": "abuse"}]'
    ),
    $$VALUES ('spent', 0)$$, 'the same complaint again (another form of the return path): spent'
);
SELECT results_eq(
    format(
        'SELECT outcome, suppressed FROM mailroom.record_bounce(%L, %L)', (SELECT c FROM rp),
        '[{"feedback_type": "not-spam"}]'
    ),
    $$VALUES ('other', 0)$$, 'Feedback-Type not-spam is no complaint'
);

-- record_refused_recipients: the relay refused some recipients of a message at RCPT
CREATE TEMP TABLE d AS
SELECT mailroom.enqueue_message('tap', ARRAY['r1@example.com', 'R2@example.com', 'r3@example.com'], 's4', 'b') AS id;
CREATE TEMP TABLE dc AS SELECT id, claim_token FROM mailroom.claim_messages(10, 'w3');
SELECT is((SELECT count(*)::integer FROM dc), 1, 'the new message is claimed');
SELECT throws_ok(
    $$SELECT mailroom.record_refused_recipients(ARRAY[1::bigint], ARRAY[]::bigint[], ARRAY['a@b.c'], NULL, NULL)$$,
    'MR364', NULL, 'arrays of different lengths: MR364'
);
SELECT is(
    mailroom.record_refused_recipients(
        ARRAY[(SELECT id FROM dc)], ARRAY[(SELECT claim_token FROM dc) + 1], ARRAY['r1@example.com'], ARRAY[550],
        ARRAY['5.1.1']
    ),
    0, 'another claim token: nothing recorded (fenced like finalize)'
);
SELECT is(
    mailroom.record_refused_recipients(
        ARRAY[(SELECT id FROM dc), (SELECT id FROM dc), (SELECT id FROM dc)],
        ARRAY[(SELECT claim_token FROM dc), (SELECT claim_token FROM dc), (SELECT claim_token FROM dc)],
        ARRAY['<R1@example.com>', 'r2@example.com', 'stranger2@example.com'],
        ARRAY[550, 451, 550], ARRAY['5.1.1', NULL, '5.1.1']
    ),
    1, 'a 5xx at RCPT for one of three recipients: that one is suppressed'
);
SELECT results_eq(
    $$SELECT address, source_message FROM mailroom.suppressions WHERE address IN ('r1@example.com', 'r2@example.com', 'stranger2@example.com')$$,
    $$SELECT 'r1@example.com', id FROM d$$,
    'only the recipient refused with 5xx, with its message as source (4xx and strangers: no)'
);
SELECT results_eq(
    $$SELECT outcome, recipient, action, smtp_code FROM mailroom.outbound_bounces WHERE message_id = (SELECT id FROM d) ORDER BY id$$,
    $$VALUES ('hard_bounce', 'to[1]', 'refused', 550), ('soft_bounce', 'to[2]', 'refused', 451)$$,
    'both refusals are noted (action refused), the stranger is not'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.outbound_bounces WHERE message_id = (SELECT id FROM d)
        AND claim_token = (SELECT claim_token FROM dc)),
    2, 'each refusal keeps the claim token of its attempt'
);

-- every recipient refused at RCPT: finalize_messages decides which refusal governs
SELECT mailroom.record_refused_recipients(
    ARRAY[(SELECT id FROM dc)], ARRAY[(SELECT claim_token FROM dc)], ARRAY['r3@example.com'], ARRAY[550], ARRAY['5.1.1']
);
SELECT results_eq(
    format(
        $$SELECT result, kind, reply_class FROM mailroom.finalize_messages(ARRAY[%s::bigint], ARRAY[%s::bigint],
            ARRAY['refused'], NULL, NULL, ARRAY['3 of 3 recipients refused'])$$,
        (SELECT id FROM dc), (SELECT claim_token FROM dc)
    ),
    $$VALUES ('retry', 'transient', '4xx')$$,
    'refused: one recipient may still take it (a 451 among the 550s): the transient refusal governs, retry'
);
SELECT results_eq(
    $$SELECT status::text, last_outcome, last_smtp_code FROM mailroom.outbound_messages WHERE id = (SELECT id FROM d)$$,
    $$VALUES ('queued', 'reply', 451)$$,
    'the message is back in the queue under the governing reply'
);
CREATE TEMP TABLE e AS SELECT mailroom.enqueue_message('tap', ARRAY['s1@example.com', 's2@example.com'], 's5', 'b') AS id;
SET LOCAL mailroom.clock = '2001-01-01Z';
CREATE TEMP TABLE ec AS SELECT id, claim_token FROM mailroom.claim_messages(10, 'w4') WHERE id = (SELECT id FROM e);
SELECT mailroom.record_refused_recipients(
    ARRAY[(SELECT id FROM ec), (SELECT id FROM ec)], ARRAY[(SELECT claim_token FROM ec), (SELECT claim_token FROM ec)],
    ARRAY['s1@example.com', 's2@example.com'], ARRAY[550, 553], ARRAY['5.1.1', NULL]
);
SELECT results_eq(
    format(
        $$SELECT result, kind, reply_class FROM mailroom.finalize_messages(ARRAY[%s::bigint], ARRAY[%s::bigint],
            ARRAY['refused'])$$,
        (SELECT id FROM ec), (SELECT claim_token FROM ec)
    ),
    $$VALUES ('failed', 'permanent', '5xx')$$,
    'refused, every refusal permanent: the message fails'
);
SELECT results_eq(
    $$SELECT last_smtp_code, last_enhanced_code FROM mailroom.outbound_messages WHERE id = (SELECT id FROM e)$$,
    $$VALUES (550, '5.1.1')$$,
    'the first refusal recorded governs among equals'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.finalize_messages(ARRAY[1::bigint], ARRAY[1::bigint], ARRAY['refusd'])$$,
    'MR331', NULL, 'an unknown outcome is still MR331'
);

-- the envelope: to, cc, bcc, every exact address once, first position kept (what a signed
-- return path's position points at; PL/pgSQL since issue 25, the same answers as the SQL form)
SELECT is(
    mailroom_internal._envelope(ARRAY['a@x.io', 'b@x.io'], ARRAY['b@x.io', 'c@x.io'], ARRAY['a@x.io', 'd@x.io']),
    ARRAY['a@x.io', 'b@x.io', 'c@x.io', 'd@x.io'], '_envelope: each address once, in to, cc, bcc order'
);
SELECT is(mailroom_internal._envelope(NULL, NULL, NULL), '{}'::text[], '_envelope: nothing gives an empty list');
SELECT is(
    mailroom_internal._envelope(ARRAY['B@x.io'], ARRAY['b@x.io'], NULL), ARRAY['B@x.io', 'b@x.io'],
    '_envelope: exact addresses (case kept, as the relay gets them)'
);
SELECT is(mailroom_internal._address_domain('Someone@Example.COM'), 'example.com', '_address_domain: lower-case domain');

-- Every RCPT asks whether its address is the feedback address or a signed one: PL/pgSQL, since a SQL
-- function with SET search_path is parsed again in every transaction (issue 46: 255 -> 165 us a
-- check_bounce_recipient); the same answers as the SQL forms (bounce domains set above)
SELECT is(
    ARRAY(
        SELECT p.proname::text FROM pg_proc AS p INNER JOIN pg_language AS l ON l.oid = p.prolang
        WHERE p.oid IN (
            'mailroom_internal._is_verp_address(text)'::regprocedure,
            'mailroom_internal._is_feedback_address(text)'::regprocedure
        ) AND l.lanname <> 'plpgsql'
    ),
    '{}'::text[], 'the RCPT address tests are PL/pgSQL'
);
SELECT ok(mailroom_internal._is_verp_address(' <Bounce+12-abc@BOUNCES.mailroom.test> '), '_is_verp_address: a return path at the setting''s domain, written any way');
SELECT ok(mailroom_internal._is_verp_address('unsubscribe+1-x@b2.example.org'), '_is_verp_address: an unsubscribe address at a sender''s bounce domain');
SELECT is(
    ARRAY[
        mailroom_internal._is_verp_address('bounce+1-x@elsewhere.example'),
        mailroom_internal._is_verp_address('bounce+1-x@b@bounces.mailroom.test'),
        mailroom_internal._is_verp_address('someone@bounces.mailroom.test'),
        mailroom_internal._is_verp_address(NULL)
    ],
    ARRAY[false, false, false, false],
    '_is_verp_address: not at a bounce domain, two @, no prefix, NULL: false'
);
SELECT is(mailroom_internal._is_feedback_address(NULL), false, '_is_feedback_address: NULL is false');
SELECT is(mailroom_internal._is_feedback_address('x@y.example'), false, '_is_feedback_address: without the setting, false');

SELECT * FROM finish();
ROLLBACK;
