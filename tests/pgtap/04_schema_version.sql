-- sql/04_schema_version.sql: every runtime role can see what the database has (the schema version
-- and the applied migrations) without reading the owner's ledger.
BEGIN;
SELECT plan(12);
\ir fixtures/default_settings.sql

SELECT is(
    mailroom.schema_version(),
    (SELECT max(version) FROM mailroom.schema_migrations),
    'schema_version() is the last applied migration'
);
SELECT cmp_ok(mailroom.schema_version(), '>=', 120, 'the schema has the migration lock (0120) or later');
SELECT is(
    (SELECT count(*)::int FROM mailroom.list_migrations()),
    (SELECT count(*)::int FROM mailroom.schema_migrations),
    'list_migrations() returns every ledger row'
);
SELECT is(
    (SELECT array_agg(version) FROM mailroom.list_migrations()),
    (SELECT array_agg(version ORDER BY version) FROM mailroom.schema_migrations),
    'in version order'
);

-- as a monitor login: the functions answer, the ledger stays closed
SET LOCAL ROLE mailroom_monitor;
SELECT is(mailroom.schema_version() IS NOT NULL, true, 'mailroom_monitor reads the schema version');
SELECT throws_ok(
    'SELECT count(*) FROM mailroom.schema_migrations', '42501', NULL,
    'mailroom_monitor may not read the ledger table itself'
);
RESET ROLE;

SET LOCAL ROLE mailroom_collector;
SELECT is(
    (SELECT name FROM mailroom.list_migrations() ORDER BY version LIMIT 1),
    '0001_foundation.sql',
    'mailroom_collector lists the migrations'
);
RESET ROLE;

-- upgrade_steps: what an upgrade from 0.1.x leaves to the operator
SELECT is((SELECT count(*)::int FROM mailroom.upgrade_steps()), 0, 'a fresh install has no step left');
SELECT results_eq(
    $$ SELECT step, command FROM mailroom.upgrade_steps('0123456789abcdef') $$,
    $$ VALUES ('signing-key', 'mailroom keys import --active') $$,
    'a MAILROOM_SECRET_KEY that is not the active key: import it as the active key'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.upgrade_steps(
        encode(substr(sha256((SELECT key FROM mailroom.signing_keys WHERE state = 'active')), 1, 8), 'hex')
    )),
    0, 'the active key: nothing to do'
);
INSERT INTO mailroom.senders (name, from_address, smtp_host, smtp_port, smtp_password_encrypted)
VALUES ('legacy', 'noreply@example.com', '127.0.0.1', 25, '\x00');
SELECT results_eq(
    $$ SELECT step, command FROM mailroom.upgrade_steps() $$,
    $$ VALUES ('sender-key', 'mailroom outbound sender-key init'),
              ('relay-passwords', 'mailroom outbound convert-passwords') $$,
    'a relay password of the previous release: make the sender key, then convert the passwords'
);
SET LOCAL ROLE mailroom_monitor;
SELECT is((SELECT count(*)::int FROM mailroom.upgrade_steps()), 2, 'mailroom_monitor reads the steps left');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
