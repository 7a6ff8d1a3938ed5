-- Least privilege for the outbound functions (sql/30-35): pinned search_path, SECURITY DEFINER
-- API, EXECUTE exactly per role, the stats view for monitor and sender, and the redaction pepper
-- (and every function that answers "what is the tag of this guess?") for the owner only.
BEGIN;
SELECT plan(19);

CREATE TEMP TABLE area (fn regprocedure PRIMARY KEY, api boolean NOT NULL);
INSERT INTO area
SELECT p.oid::regprocedure, p.proname !~ '^(_|trg_)' AND p.proname <> 'redact_pii'
FROM pg_proc AS p
WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)
    AND p.proname IN (
        '_clock_default', '_check_outbound_key', 'upsert_sender', '_smtp_password', '_redaction_tag', 'redact_pii',
        'trg_outbound_redact_error_log', '_check_recipients', '_check_extra_headers', 'enqueue_message', 'enqueue_message_with_attachments', '_outbound_attachments', '_attachments_json',
        '_claim', '_claim_limited_due', '_statement_of', 'claim_messages', '_explain_claim', '_classify_outcome', '_retry_delay', '_log_line',
        '_gives_up', '_attempt_log', '_reply_class', 'finalize_messages', 'release_messages', 'reap_stuck_messages',
        '_check_outbound_status', 'list_outbound_messages', 'show_outbound_message',
        'retry_message', 'retry_failed_messages', 'purge_sent_messages', '_header_breaking_chars', '_enqueue_message',
        '_pii_pattern', '_pii_identity', '_is_loopback_host', 'set_sender_public_key', 'sender_public_key',
        '_seal_for_sender', 'convert_sender_passwords', 'list_senders', 'outbound_stats', '_queue_verb_statuses',
        '_operator_log', '_queue_verb', '_queue_verb_change', 'hold_messages', 'release_held_messages', 'cancel_messages', 'delete_messages',
        'run_messages_now', 'retry_messages', 'outbound_queue'
    );
-- claim_messages has two forms this release (the keyed one is deprecated); _operator_log one (the
-- three-argument form went with migration 0186)
SELECT is((SELECT count(*)::integer FROM area), 57, 'the outbound area has its 57 functions');

SELECT is(
    (
        SELECT coalesce(string_agg(a.fn::text, ', ' ORDER BY a.fn::text), '')
        FROM area AS a INNER JOIN pg_proc AS p ON a.fn = p.oid
        WHERE NOT coalesce('search_path=pg_catalog, pg_temp' = ANY(p.proconfig), false)
    ),
    '',
    'every outbound function pins search_path = pg_catalog, pg_temp'
);
SELECT is(
    (
        SELECT coalesce(string_agg(a.fn::text, ', ' ORDER BY a.fn::text), '')
        FROM area AS a INNER JOIN pg_proc AS p ON a.fn = p.oid
        WHERE p.prosecdef <> a.api
    ),
    '',
    'the outbound API runs as its owner; helpers, triggers and redact_pii run as the caller'
);
SELECT is(
    (
        SELECT coalesce(string_agg(a.fn::text, ', ' ORDER BY a.fn::text), '')
        FROM area AS a INNER JOIN pg_proc AS p ON a.fn = p.oid
        WHERE p.prosrc ~ '(?<![._a-z])(gen_random_bytes|gen_random_uuid|digest|hmac|pgp_sym_encrypt|pgp_sym_decrypt|pgp_pub_encrypt|pgp_key_id)\('
    ),
    '',
    'pgcrypto only through the mailroom_internal._* wrappers, gen_random_uuid as pg_catalog.gen_random_uuid'
);

CREATE TEMP TABLE roles (role text);
INSERT INTO roles
SELECT unnest(ARRAY[
    'public', 'mailroom_app', 'mailroom_collector', 'mailroom_sender', 'mailroom_inbound', 'mailroom_monitor',
    'mailroom_admin', 'mailroom_timekeeper'
]);
SELECT results_eq(
    $$SELECT r.role, coalesce(
        (SELECT string_agg(p.proname, ', ' ORDER BY p.proname) FROM area AS a JOIN pg_proc AS p ON a.fn = p.oid
            WHERE has_function_privilege(r.role, a.fn, 'EXECUTE')),
        '-') COLLATE "default"
      FROM roles AS r ORDER BY r.role$$,
    $$VALUES
        ('mailroom_admin', 'cancel_messages, convert_sender_passwords, delete_messages, hold_messages, list_outbound_messages, list_senders, outbound_queue, outbound_stats, purge_sent_messages, reap_stuck_messages, release_held_messages, retry_failed_messages, retry_message, retry_messages, run_messages_now, sender_public_key, set_sender_public_key, show_outbound_message, upsert_sender'),
        ('mailroom_app', 'enqueue_message, enqueue_message_with_attachments'),
        ('mailroom_collector', '-'),
        ('mailroom_inbound', '-'),
        ('mailroom_monitor', 'list_outbound_messages, outbound_queue, outbound_stats'),
        ('mailroom_sender', 'claim_messages, claim_messages, finalize_messages, outbound_stats, reap_stuck_messages, release_messages'),
        ('mailroom_timekeeper', '-'),
        ('public', '-')$$,
    'each runtime role executes exactly its outbound functions (admin through monitor too)'
);
SELECT results_eq(
    $$SELECT r.role, has_table_privilege(r.role, 'mailroom.outbound_stats', 'SELECT') FROM roles AS r ORDER BY r.role$$,
    $$VALUES ('mailroom_admin', true), ('mailroom_app', false), ('mailroom_collector', false),
             ('mailroom_inbound', false), ('mailroom_monitor', true), ('mailroom_sender', true),
             ('mailroom_timekeeper', false), ('public', false)$$,
    'outbound_stats is readable by monitor (and admin) and the sender only'
);
SELECT is(
    (
        SELECT count(*)::integer
        FROM unnest(ARRAY[
            'mailroom.senders', 'mailroom.outbound_messages', 'mailroom.outbound_counters', 'mailroom.redaction_pepper'
        ]::regclass []) AS t (tbl), roles AS r
        WHERE has_table_privilege(r.role, t.tbl, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
    )
    + (
        SELECT count(*)::integer FROM roles AS r
        WHERE has_sequence_privilege(r.role, 'mailroom.outbound_claim_token_seq', 'USAGE, SELECT, UPDATE')
    ),
    0,
    'no runtime role has any privilege on the outbound tables, the pepper or the claim sequence'
);

-- the pepper oracle: nobody but the owner
SELECT is(
    (
        SELECT count(*)::integer FROM roles AS r
        WHERE has_function_privilege(r.role, 'mailroom_internal._redaction_tag(text)', 'EXECUTE')
            OR has_function_privilege(r.role, 'mailroom.redact_pii(text)', 'EXECUTE')
    ),
    0,
    '_redaction_tag and redact_pii (tag oracles for the pepper) are executable by no runtime role'
);
SELECT ok(
    NOT (SELECT p.prosecdef FROM pg_proc AS p WHERE p.oid = 'mailroom_internal._redaction_tag(text)'::regprocedure),
    '_redaction_tag is not SECURITY DEFINER (it runs with the rights of the owner''s API, never lends them)'
);
SET LOCAL ROLE mailroom_admin;
SELECT throws_ok($$SELECT mailroom_internal._redaction_tag('alice@example.com')$$, '42501', NULL, 'admin cannot ask for a tag');
SELECT throws_ok($$SELECT mailroom.redact_pii('alice@example.com')$$, '42501', NULL, 'nor through redact_pii');
SELECT throws_ok('SELECT pepper FROM mailroom.redaction_pepper', '42501', NULL, 'nor read the pepper');
RESET ROLE;

-- each part works with its role's rights alone
SET LOCAL mailroom.clock = '2030-01-01 00:00Z';
SET LOCAL ROLE mailroom_admin;
SELECT ok(mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525) > 0, 'admin upserts a sender');
RESET ROLE;
SET LOCAL ROLE mailroom_app;
SELECT ok(
    mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't') > 0,
    'the application enqueues (the definer function inserts, NOTIFYs and takes the claim sequence later)'
);
RESET ROLE;
SET LOCAL ROLE mailroom_sender;
CREATE TEMP TABLE claimed AS SELECT id, claim_token FROM mailroom.claim_messages(10, 'tap');
SELECT is(
    (
        SELECT result || ' ' || reply_class
        FROM mailroom.finalize_messages(
            ARRAY(SELECT id FROM claimed), ARRAY(SELECT claim_token FROM claimed), ARRAY['reply'], ARRAY[550],
            ARRAY['5.1.1'], ARRAY['550 5.1.1 <a@example.com> unknown']
        )
    ),
    'failed 5xx',
    'the sender claims and finalizes (the error_log trigger redacts as the owner)'
);
SELECT is((SELECT failed FROM mailroom.outbound_stats), 1::bigint, 'the sender reads outbound_stats');
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't')$$, '42501', NULL,
    'the sender may not enqueue'
);
RESET ROLE;
SET LOCAL ROLE mailroom_monitor;
SELECT is(
    (SELECT status::text FROM mailroom.list_outbound_messages()), 'failed', 'monitor lists messages'
);
RESET ROLE;
SELECT unalike(
    (SELECT error_log FROM mailroom.outbound_messages), '%@%', 'and the error_log written for the sender was scrubbed'
);

SELECT * FROM finish();
ROLLBACK;
