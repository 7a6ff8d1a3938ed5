-- Least privilege for the inbox functions (sql/20-23): no runtime role touches a table, each part
-- works with its role's rights alone, and a caller's search_path cannot reach into the API. Pinned
-- search_path, SECURITY DEFINER API and EXECUTE per role: tests/pgtap/05_privileges.sql and, against
-- the GRANT lines of sql/, tests/db/test_privileges.py.
BEGIN;
SELECT plan(10);
\ir fixtures/default_settings.sql

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
-- the clock before any installation existed: expire_mailboxes meets this test's inboxes alone
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
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
SELECT * FROM finish();
ROLLBACK;
