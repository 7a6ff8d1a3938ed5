-- Least privilege for the collector functions (sql/40-41): pinned search_path, SECURITY DEFINER
-- API, EXECUTE for mailroom_collector only, no table privilege.
BEGIN;
SELECT plan(7);

CREATE TEMP TABLE area (fn regprocedure PRIMARY KEY, api boolean NOT NULL);
INSERT INTO area
SELECT p.oid::regprocedure, p.proname !~ '^(_|trg_)'
FROM pg_proc AS p
WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)
    AND p.proname IN ('_html_escape', 'render_token_email', 'enqueue_token_emails', '_token_email_subject',
        '_claim_token_email');
-- enqueue_token_emails has two forms this release (the keyed one is deprecated)
SELECT is((SELECT count(*)::integer FROM area), 6, 'the collector area has its 6 functions');
SELECT is(
    (
        SELECT coalesce(string_agg(a.fn::text, ', ' ORDER BY a.fn::text), '')
        FROM area AS a INNER JOIN pg_proc AS p ON a.fn = p.oid
        WHERE NOT coalesce('search_path=pg_catalog, pg_temp' = ANY(p.proconfig), false)
            OR p.prosecdef <> a.api
    ),
    '',
    'every collector function pins its search_path; the API runs as its owner, the helper as the caller'
);
SELECT results_eq(
    $$SELECT r.role, coalesce(
        (SELECT string_agg(p.proname, ', ' ORDER BY p.proname) FROM area AS a JOIN pg_proc AS p ON a.fn = p.oid
            WHERE has_function_privilege(r.role, a.fn, 'EXECUTE')),
        '-') COLLATE "default"
      FROM unnest(ARRAY[
        'public', 'mailroom_app', 'mailroom_collector', 'mailroom_sender', 'mailroom_inbound', 'mailroom_monitor',
        'mailroom_admin', 'mailroom_timekeeper']) AS r (role)
      ORDER BY r.role$$,
    $$VALUES
        ('mailroom_admin', '-'),
        ('mailroom_app', '-'),
        ('mailroom_collector', 'enqueue_token_emails, enqueue_token_emails, render_token_email'),
        ('mailroom_inbound', '-'),
        ('mailroom_monitor', '-'),
        ('mailroom_sender', '-'),
        ('mailroom_timekeeper', '-'),
        ('public', '-')$$,
    'only mailroom_collector executes the collector functions'
);
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
