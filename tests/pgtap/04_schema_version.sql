-- sql/04_schema_version.sql: every runtime role can see what the database has (the schema version
-- and the applied migrations) without reading the owner's ledger.
BEGIN;
SELECT plan(7);

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

SELECT * FROM finish();
ROLLBACK;
