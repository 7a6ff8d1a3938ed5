-- Foundation: schema, migrations ledger, settings and the settable clock.
BEGIN;
SELECT plan(17);

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

-- settings
INSERT INTO mailroom.settings (name, value, description) VALUES ('test.answer', '42', 'a test setting');
SELECT is(mailroom.set_setting('test.answer', '43'), '43', 'set_setting changes a setting');
SELECT is(mailroom.setting('test.answer'), '43', 'setting reads it back');
SELECT throws_ok(
    $$SELECT mailroom.setting('test.missing')$$, 'MR001', 'unknown setting ''test.missing''',
    'an unknown setting is a clear MR001 error'
);

SELECT * FROM finish();
ROLLBACK;
