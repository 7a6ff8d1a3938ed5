-- maintain_partitions deletes the rate windows past an hour and the audit lines past audit.retention
-- (sql/09_rates.sql, _prune_rates_and_audit). On the test cluster only (tests/pgtap_fresh: never
-- shipped, never run by db verify): with the clock months ahead maintain_partitions also creates
-- partitions, DDL whose locks every live worker would wait for until the ROLLBACK (a live sender's
-- claim waited 1.3 s behind it). The rates themselves: tests/pgtap/09_rates.sql.
BEGIN;
SELECT plan(2);
\ir ../pgtap/fixtures/default_settings.sql

-- five windows: two subjects of one minute, and one subject in three minutes of an hour
SET LOCAL mailroom.clock = '2030-01-01 00:00:10+00';
SELECT mailroom.set_setting('checks.rate_per_key', '2/min');
SELECT mailroom.set_setting('checks.rate_per_inbox', '3/h');
SELECT mailroom_internal._take_rate('t.key', 'k1', 'checks.rate_per_key');
SELECT mailroom_internal._take_rate('t.key', 'k1', 'checks.rate_per_key');
SELECT mailroom_internal._take_rate('t.key', 'k2', 'checks.rate_per_key');
SELECT mailroom_internal._take_rate('t.inbox', '7', 'checks.rate_per_inbox');
SET LOCAL mailroom.clock = '2030-01-01 00:20:00+00';
SELECT mailroom_internal._take_rate('t.inbox', '7', 'checks.rate_per_inbox');
SET LOCAL mailroom.clock = '2030-01-01 01:00:00+00';
SELECT mailroom_internal._take_rate('t.inbox', '7', 'checks.rate_per_inbox');
SELECT mailroom_internal._audit('release', 42, 'api', 'team-1', 1, 2, 3, 1);

SET LOCAL mailroom.clock = '2030-06-01 00:00:00+00';
CREATE TEMP TABLE report AS SELECT * FROM mailroom.maintain_partitions();
SELECT is(
    (SELECT string_agg(action || ' ' || row_count, ', ' ORDER BY action) FROM report
     WHERE table_name IN ('rate_windows', 'audit_log')),
    'audit_deleted 1, windows_deleted 5',
    'maintain_partitions deletes the windows past an hour and the audit lines past audit.retention'
);
SELECT is((SELECT count(*)::int FROM mailroom.rate_windows) + (SELECT count(*)::int FROM mailroom.audit_log), 0,
    'none left');

SELECT * FROM finish();
ROLLBACK;
