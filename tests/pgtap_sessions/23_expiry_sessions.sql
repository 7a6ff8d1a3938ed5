-- expire_mailboxes' lock path (SKIP LOCKED) with a second real session through dblink. Moved out of
-- tests/pgtap/23_expiry.sql: it commits rows through that session, so it runs only on the test cluster
-- (`python -m mailroom.testing pgtap`), never by `db verify`.
BEGIN;
SELECT plan(6);

SET LOCAL client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS dblink;

-- ---------------------------------------------------------------- lock path (two sessions)
-- Committed rows are needed so the other session sees them; they are removed at the end.
CREATE TEMP TABLE conninfo AS
SELECT format(
    'dbname=%s port=%s host=%s user=%s',
    current_database(), current_setting('port'),
    coalesce(nullif(split_part(current_setting('unix_socket_directories'), ',', 1), ''), 'localhost'),
    current_user
) AS s;

SELECT dblink_connect('setup', (SELECT s FROM conninfo));
SELECT dblink_connect('holder', (SELECT s FROM conninfo));
SELECT dblink_exec('setup', $$
    INSERT INTO mailroom.mailboxes (address, plan, session_token_digest, expires_at, created_at)
    SELECT format('lockpath-%s@lock.test', g), 'free', '\x00', '2000-01-01 00:00+00', '2000-01-01 00:00+00'
    FROM generate_series(1, 3) AS g
$$);

SAVEPOINT lockpath;
SET LOCAL lock_timeout = '300ms';
SELECT dblink_exec('holder', 'BEGIN');
SELECT dblink_exec('holder', $$SET LOCAL lock_timeout = '300ms'$$);
SELECT * FROM dblink(
    'holder', $$SELECT 1 FROM mailroom.mailboxes WHERE address = 'lockpath-1@lock.test' FOR UPDATE$$
) AS t (one integer);

SELECT is(mailroom.expire_mailboxes(), 2, 'a row locked by another session is skipped, without waiting');
SELECT ok(
    (SELECT is_active FROM mailroom.mailboxes WHERE address = 'lockpath-1@lock.test'),
    'the locked mailbox is left to the session holding it'
);
SELECT is(
    (SELECT n FROM dblink('holder', 'SELECT mailroom.expire_mailboxes()') AS t (n integer)),
    1,
    'a second worker at the same time expires only what the first did not claim (no wait, no deadlock)'
);
SELECT dblink_exec('holder', 'COMMIT');
SELECT is(mailroom.expire_mailboxes(), 0, 'nothing is left: every due mailbox was expired exactly once');
SELECT is(
    (SELECT count(*) FROM mailroom.mailboxes WHERE address LIKE 'lockpath-%' AND NOT is_active),
    3::bigint, 'all three are inactive'
);
ROLLBACK TO SAVEPOINT lockpath;
SELECT dblink_exec('setup', $$DELETE FROM mailroom.mailboxes WHERE address LIKE 'lockpath-%'$$);
-- (an assertion after the savepoint: pgTAP's record of the ones above rolled back with it)
SELECT is(
    (SELECT n FROM dblink('setup', $$SELECT count(*) FROM mailroom.mailboxes WHERE address LIKE 'lockpath-%'$$) AS t (n bigint)),
    0::bigint, 'the committed rows are removed'
);
SELECT dblink_disconnect('setup');
SELECT dblink_disconnect('holder');

SELECT * FROM finish();
ROLLBACK;
