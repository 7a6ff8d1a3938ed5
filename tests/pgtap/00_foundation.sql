-- Foundation: schema, migrations ledger, settings and the settable clock.
BEGIN;
SELECT plan(33);
\ir fixtures/default_settings.sql

SELECT has_schema('mailroom', 'schema mailroom exists');
SELECT has_extension('pgcrypto', 'pgcrypto is installed');
SELECT hasnt_extension('dblink', 'a fresh install creates no dblink extension');
SELECT has_table('mailroom', 'schema_migrations', 'migrations ledger exists');
SELECT columns_are(
    'mailroom', 'schema_migrations', ARRAY['version', 'name', 'sha256', 'applied_at'],
    'ledger records version, name, sha256 and applied_at'
);
SELECT ok(
    (SELECT count(*) FROM mailroom.schema_migrations WHERE version = 1 AND sha256 ~ '^[0-9a-f]{64}$') = 1,
    'migration 0001 is recorded with its sha256'
);
SELECT has_table('mailroom', 'settings', 'settings table exists');

-- the clock, unpinned: follows real time, advances within a transaction
SELECT ok(
    mailroom.clock() BETWEEN now() AND clock_timestamp(),
    'unpinned clock reads the real time'
);
SELECT pg_sleep(0.02);
SELECT ok(
    mailroom.clock() >= now() + interval '20 milliseconds',
    'unpinned clock is not frozen at transaction start'
);

-- pinned with SET LOCAL
SET LOCAL mailroom.clock = '2030-01-02 03:04:05+00';
SELECT is(mailroom.clock(), '2030-01-02 03:04:05+00'::timestamptz, 'SET LOCAL mailroom.clock pins the clock');
SELECT is(mailroom.clock(), '2030-01-02 03:04:05+00'::timestamptz, 'a pinned clock does not move');

-- pinned through the function, then released
SELECT is(
    mailroom.pin_clock('2031-06-01 12:00:00+00'), '2031-06-01 12:00:00+00'::timestamptz,
    'pin_clock returns the pinned time'
);
SELECT is(mailroom.clock(), '2031-06-01 12:00:00+00'::timestamptz, 'pin_clock pins the clock');
SELECT ok(mailroom.unpin_clock() < '2031-01-01'::timestamptz, 'unpin_clock returns to real time');

-- who may move time: a member of mailroom_timekeeper, decided on the login role (session_user)
CREATE ROLE mr_test_app NOLOGIN IN ROLE mailroom_app;
CREATE ROLE mr_test_keeper NOLOGIN IN ROLE mailroom_timekeeper, mailroom_app;
CREATE ROLE mr_test_nested NOLOGIN IN ROLE mr_test_keeper;
SELECT is(mailroom_internal._may_pin_clock('mr_test_app'), false, 'a mailroom_app member may not pin the clock');
SELECT is(mailroom_internal._may_pin_clock('mr_test_keeper'), true, 'a mailroom_timekeeper member may');
SELECT is(mailroom_internal._may_pin_clock('mr_test_nested'), true, 'so may a member through another role');
SELECT is(mailroom_internal._may_pin_clock('mailroom_app'), false, 'mailroom_app itself may not');
SELECT is(mailroom_internal._may_pin_clock('mr_no_such_role'), false, 'an unknown role may not (no error)');
SELECT is(mailroom_internal._may_pin_clock(NULL), false, 'NULL may not');
SELECT is(mailroom_internal._may_pin_clock(session_user), true, 'the superuser running pgTAP may (member of every role)');

-- clock() applies the rule to the login role: switch the session's authorization, pin, read
SET LOCAL mailroom.clock = '2001-01-01 00:00:00+00';
SET LOCAL SESSION AUTHORIZATION mr_test_app;
SELECT set_config('mr_test.app_clock', mailroom.clock()::text, true);
DO $$
BEGIN
    PERFORM mailroom.pin_clock('2001-01-01 00:00:00+00');
    PERFORM set_config('mr_test.app_pin', 'no error', true);
EXCEPTION
    WHEN OTHERS THEN
        PERFORM set_config('mr_test.app_pin', SQLSTATE, true);
END;
$$;
RESET SESSION AUTHORIZATION;
SET LOCAL SESSION AUTHORIZATION mr_test_keeper;
SELECT set_config('mr_test.keeper_clock', mailroom.clock()::text, true);
SELECT set_config('mr_test.keeper_pin', mailroom.pin_clock('2002-02-02 00:00:00+00')::text, true);
SELECT set_config('mr_test.keeper_pinned', mailroom.clock()::text, true);
RESET SESSION AUTHORIZATION;
SELECT cmp_ok(
    current_setting('mr_test.app_clock')::timestamptz, '>', '2020-01-01'::timestamptz,
    'a session logged in as a mailroom_app member ignores the pinned mailroom.clock: real time'
);
SELECT is(current_setting('mr_test.app_pin'), '42501', 'and may not execute pin_clock');
SELECT is(
    current_setting('mr_test.keeper_clock')::timestamptz, '2001-01-01 00:00:00+00'::timestamptz,
    'a session logged in as a mailroom_timekeeper member reads the pinned time'
);
SELECT is(
    current_setting('mr_test.keeper_pinned')::timestamptz, '2002-02-02 00:00:00+00'::timestamptz,
    'and pins it with pin_clock'
);
CREATE ROLE mr_test_keeper_only NOLOGIN IN ROLE mailroom_timekeeper;
SET LOCAL SESSION AUTHORIZATION mr_test_keeper_only;
SELECT set_config('mr_test.keeper_only_pin', mailroom.pin_clock('2003-03-03 00:00:00+00')::text, true);
RESET SESSION AUTHORIZATION;
SELECT is(
    current_setting('mr_test.keeper_only_pin')::timestamptz, '2003-03-03 00:00:00+00'::timestamptz,
    'mailroom_timekeeper alone reaches the schema and pin_clock'
);
-- EXECUTE granted by mistake does not let another role pin
GRANT EXECUTE ON FUNCTION mailroom.pin_clock(timestamptz, boolean) TO mr_test_app;
SET LOCAL SESSION AUTHORIZATION mr_test_app;
DO $$
BEGIN
    PERFORM mailroom.pin_clock('2001-01-01 00:00:00+00');
    PERFORM set_config('mr_test.app_pin', 'no error', true);
EXCEPTION
    WHEN OTHERS THEN
        PERFORM set_config('mr_test.app_pin', SQLSTATE, true);
END;
$$;
RESET SESSION AUTHORIZATION;
SELECT is(current_setting('mr_test.app_pin'), 'MR005', 'pin_clock itself refuses a role that is not a timekeeper (MR005)');
SET LOCAL ROLE mailroom_app;
SELECT throws_ok(
    $$SELECT mailroom.pin_clock('2001-01-01 00:00:00+00')$$, '42501', NULL,
    'SET ROLE mailroom_app: pin_clock is not executable'
);
SELECT throws_ok(
    $$SELECT mailroom.unpin_clock()$$, '42501', NULL,
    'SET ROLE mailroom_app: unpin_clock is not executable'
);
RESET ROLE;
SELECT throws_ok(
    $$SELECT mailroom.pin_clock(NULL)$$, '22004', 'pin_clock: the time and p_local must not be NULL',
    'pin_clock(NULL) is an error, not a silent reset'
);
SELECT mailroom.unpin_clock();

-- settings
INSERT INTO mailroom.settings (name, value, description, kind) VALUES ('test.answer', '42', 'a test setting', 'integer');
SELECT is(mailroom.set_setting('test.answer', '43'), '43', 'set_setting changes a setting');
SELECT is(mailroom.setting('test.answer'), '43', 'setting reads it back');
SELECT throws_ok(
    $$SELECT mailroom.setting('test.missing')$$, 'MR001', 'unknown setting ''test.missing''',
    'an unknown setting is a clear MR001 error'
);

SELECT * FROM finish();
ROLLBACK;
