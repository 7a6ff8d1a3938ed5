-- Least privilege for the outbound area: the stats view for monitor and sender, the redaction
-- pepper (and every function that answers "what is the tag of this guess?") for the owner only,
-- and each part working with its role's rights alone. Pinned search_path, SECURITY DEFINER API and
-- EXECUTE per role are checked for every function by tests/pgtap/05_privileges.sql and, against the
-- GRANT lines of sql/, by tests/db/test_privileges.py.
BEGIN;
SELECT plan(15);
\ir fixtures/default_settings.sql

CREATE TEMP TABLE roles (role text);
INSERT INTO roles
SELECT unnest(ARRAY[
    'public', 'mailroom_app', 'mailroom_collector', 'mailroom_sender', 'mailroom_inbound', 'mailroom_monitor',
    'mailroom_admin', 'mailroom_timekeeper'
]);
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

-- each part works with its role's rights alone; the clock before any installation existed, so the
-- claim meets the test's message alone (a row is due once made: docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
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
RESET ROLE;
SELECT is((SELECT count(*)::integer FROM claimed), 1, 'the claim takes the test''s message alone');
SELECT id AS claimed_id FROM claimed \gset
SET LOCAL ROLE mailroom_sender;
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
SELECT ok((SELECT failed FROM mailroom.outbound_stats) >= 1, 'the sender reads outbound_stats');
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't')$$, '42501', NULL,
    'the sender may not enqueue'
);
RESET ROLE;
SET LOCAL ROLE mailroom_monitor;
SELECT is(
    (SELECT l.status::text FROM mailroom.list_outbound_messages() AS l WHERE l.id = :claimed_id),
    'failed', 'monitor lists messages'
);
RESET ROLE;
SELECT unalike(
    (SELECT error_log FROM mailroom.outbound_messages WHERE id = :claimed_id), '%@%', 'and the error_log written for the sender was scrubbed'
);

SELECT * FROM finish();
ROLLBACK;
