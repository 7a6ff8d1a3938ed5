-- Least privilege for the inbox functions (sql/20-23): every function pins its search_path, the
-- API a runtime role calls runs as the owner (SECURITY DEFINER), each runtime role may execute
-- exactly its part of it, and no runtime role touches a table.
BEGIN;
SELECT plan(16);

CREATE TEMP TABLE area (fn regprocedure PRIMARY KEY, api boolean NOT NULL);
INSERT INTO area
SELECT p.oid::regprocedure, p.proname !~ '^(_|trg_)'
FROM pg_proc AS p
WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)
    AND p.proname IN (
        '_normalize_address', '_session_token_digest', '_mailbox_open', 'create_mailbox', '_authorize_mailbox',
        'extend_mailbox', 'delete_mailbox', 'check_recipient', 'mailbox_accepts', 'max_inbound_message_bytes',
        'list_mailboxes', 'deliver_message', 'list_messages', 'read_message', '_batch_size', 'expire_mailboxes',
        'seconds_until_next_expiry', 'trg_mailboxes_schedule', 'purge_mailboxes', 'run_expiry'
    );
SELECT is((SELECT count(*)::integer FROM area), 21, 'the inbox area has its 21 functions');

SELECT is(
    (
        SELECT coalesce(string_agg(a.fn::text, ', ' ORDER BY a.fn::text), '')
        FROM area AS a INNER JOIN pg_proc AS p ON a.fn = p.oid
        WHERE NOT coalesce('search_path=pg_catalog, pg_temp' = ANY(p.proconfig), false)
    ),
    'mailroom.run_expiry(interval,integer,integer)',
    'every inbox function pins search_path = pg_catalog, pg_temp, except run_expiry (a SET clause forbids its COMMIT)'
);
SELECT is(
    (
        SELECT coalesce(string_agg(a.fn::text, ', ' ORDER BY a.fn::text), '')
        FROM area AS a INNER JOIN pg_proc AS p ON a.fn = p.oid
        WHERE p.prosecdef <> (a.api AND p.proname <> 'run_expiry')
    ),
    '',
    'the inbox API runs as its owner; helpers, the trigger and run_expiry (it commits) run as the caller'
);
SELECT is(
    (
        SELECT coalesce(string_agg(a.fn::text, ', ' ORDER BY a.fn::text), '')
        FROM area AS a INNER JOIN pg_proc AS p ON a.fn = p.oid
        WHERE p.prosrc ~ '(?<![._a-z])(gen_random_bytes|gen_random_uuid|digest|hmac|pgp_sym_encrypt|pgp_sym_decrypt)\('
    ),
    '',
    'pgcrypto only through the mailroom_internal._* wrappers'
);

-- who may execute what: exactly the matrix
CREATE TEMP TABLE granted (role text, fns text);
INSERT INTO granted
SELECT r.role, coalesce(
    (SELECT string_agg(p.proname, ', ' ORDER BY p.proname) FROM area AS a JOIN pg_proc AS p ON a.fn = p.oid
        WHERE has_function_privilege(r.role, a.fn, 'EXECUTE')),
    '-'
)
FROM unnest(ARRAY[
    'public', 'mailroom_app', 'mailroom_collector', 'mailroom_sender', 'mailroom_inbound', 'mailroom_monitor',
    'mailroom_admin', 'mailroom_timekeeper'
]) AS r (role);
SELECT results_eq(
    'SELECT role, fns FROM granted ORDER BY role',
    $$VALUES
        ('mailroom_admin', '-'),
        ('mailroom_app', 'create_mailbox, delete_mailbox, extend_mailbox, list_mailboxes, list_messages, mailbox_accepts, read_message'),
        ('mailroom_collector', '-'),
        ('mailroom_inbound', 'check_recipient, deliver_message, expire_mailboxes, max_inbound_message_bytes, purge_mailboxes, run_expiry, seconds_until_next_expiry'),
        ('mailroom_monitor', '-'),
        ('mailroom_sender', '-'),
        ('mailroom_timekeeper', '-'),
        ('public', '-')$$,
    'each runtime role executes exactly its inbox functions; helpers and the trigger belong to nobody'
);
SELECT is(
    (
        SELECT count(*)::integer
        FROM unnest(ARRAY['mailroom.plans', 'mailroom.mailboxes', 'mailroom.messages']::regclass []) AS t (tbl),
            unnest(ARRAY[
                'public', 'mailroom_app', 'mailroom_collector', 'mailroom_sender', 'mailroom_inbound',
                'mailroom_monitor', 'mailroom_admin', 'mailroom_timekeeper'
            ]) AS r (role)
        WHERE has_table_privilege(r.role, t.tbl, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
    ),
    0,
    'no runtime role has any privilege on plans, mailboxes or messages'
);

-- the application's and the inbound server's parts work with their rights alone
SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
SET LOCAL ROLE mailroom_app;
CREATE TEMP TABLE box AS SELECT * FROM mailroom.create_mailbox(10, 'free');
SELECT ok(
    mailroom.extend_mailbox((SELECT address FROM box), (SELECT session_token FROM box), 5) IS NOT null,
    'mailroom_app creates and extends a mailbox'
);
SELECT ok(mailroom.mailbox_accepts((SELECT address FROM box)), 'mailroom_app asks whether it accepts mail');
SELECT throws_ok(
    format('SELECT mailroom.deliver_message(%L, %L::bytea)', (SELECT address FROM box), '\x41'),
    '42501', NULL, 'mailroom_app may not deliver'
);
SELECT throws_ok('SELECT count(*) FROM mailroom.mailboxes', '42501', NULL, 'mailroom_app may not read the table');
RESET ROLE;
GRANT SELECT ON box TO mailroom_inbound;
SET LOCAL ROLE mailroom_inbound;
SELECT is(
    (SELECT verdict FROM mailroom.check_recipient((SELECT address FROM box))), 'ok',
    'mailroom_inbound checks a recipient'
);
SELECT ok(
    mailroom.deliver_message((SELECT address FROM box), '\x41'::bytea, 'a@example.org', 'hi') > 0,
    'mailroom_inbound delivers (the definer function writes messages and the count)'
);
SELECT is(mailroom.expire_mailboxes(), 0, 'mailroom_inbound runs an expiry batch');
SELECT throws_ok('SELECT * FROM mailroom.create_mailbox()', '42501', NULL, 'mailroom_inbound may not create mailboxes');
RESET ROLE;

-- a caller's search_path cannot reach into the API: a lower(text) of its own is not used
CREATE SCHEMA tap_evil;
CREATE FUNCTION tap_evil.lower(text) RETURNS text LANGUAGE sql AS $$ SELECT 'evil@mailroom.test' $$;
GRANT USAGE ON SCHEMA tap_evil TO mailroom_app;
GRANT EXECUTE ON FUNCTION tap_evil.lower(text) TO mailroom_app;
SET LOCAL ROLE mailroom_app;
SET LOCAL search_path = tap_evil, pg_catalog;
CREATE TEMP TABLE hostile AS
SELECT count(*)::integer AS n
FROM mailroom.list_messages(upper((SELECT address FROM box)), (SELECT session_token FROM box));
RESET search_path;
RESET ROLE;
SELECT is(
    (SELECT n FROM hostile), 1,
    'mailroom_app with a hostile search_path still reads its mailbox by the real lower()'
);
SELECT is(
    (SELECT fns FROM granted WHERE role = 'mailroom_app') <> '-', true, 'sanity: the grant table was filled'
);

SELECT * FROM finish();
ROLLBACK;
