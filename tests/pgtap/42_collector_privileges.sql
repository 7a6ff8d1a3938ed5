-- Least privilege for the collector functions (sql/40-41): no table privilege, the collector's part
-- works with its rights alone, the application's does not reach it. Pinned search_path, SECURITY
-- DEFINER API and EXECUTE per role: tests/pgtap/05_privileges.sql and tests/db/test_privileges.py.
BEGIN;
SELECT plan(4);
\ir fixtures/default_settings.sql

SELECT ok(
    NOT has_table_privilege('mailroom_collector', 'mailroom.token_email_templates', 'SELECT, INSERT, UPDATE, DELETE'),
    'the collector has no privilege on the templates table (the definer function reads it)'
);

SET LOCAL ROLE mailroom_collector;
SELECT is(
    (SELECT e.subject FROM mailroom.render_token_email('activation', 'a@example.test', 'ann', 'AbC', null) AS e),
    'Activate your account',
    'mailroom_collector renders an email with its rights alone'
);
RESET ROLE;
SET LOCAL ROLE mailroom_app;
SELECT throws_ok(
    $$SELECT mailroom.enqueue_token_emails(10)$$, '42501', NULL,
    'the application may not enqueue token emails'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.render_token_email('activation', 'a@example.test', 'ann', 'AbC', null)$$, '42501', NULL,
    'nor render them'
);
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
