-- Expiry counts and batches, purge with cascade, and the concurrent lock path (SKIP LOCKED),
-- exercised with a second real session through dblink.
BEGIN;
SELECT plan(30);
\ir fixtures/default_settings.sql

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
SELECT dblink_disconnect('setup');
SELECT dblink_disconnect('holder');

-- ---------------------------------------------------------------- counts and batches
SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE b AS
SELECT 'deleted' AS k, * FROM mailroom.create_mailbox(10);
DO $$
BEGIN
    FOR i IN 1..5 LOOP
        INSERT INTO b SELECT 'short', * FROM mailroom.create_mailbox(10);
    END LOOP;
    FOR i IN 1..3 LOOP
        INSERT INTO b SELECT 'long', * FROM mailroom.create_mailbox(30);
    END LOOP;
END
$$;
SELECT mailroom.delete_mailbox(address, session_token) FROM b WHERE k = 'deleted';
SELECT mailroom.deliver_message(address, '\x41'::bytea) FROM b, generate_series(1, 2) WHERE k <> 'deleted';

SELECT is(mailroom.expire_mailboxes(), 0, 'nothing is due before expiry');
SELECT is(mailroom.seconds_until_next_expiry(), 600::double precision, 'the next inbox is due in 10 minutes');

SET LOCAL mailroom.clock = '2030-01-01 00:10:00+00';
SELECT is(mailroom.expire_mailboxes(2), 2, 'a batch expires at most p_batch mailboxes');
SELECT is(mailroom.expire_mailboxes(), 3, 'the next call expires the rest that is due');
SELECT is(mailroom.expire_mailboxes(), 0, 'then nothing is left');
SELECT is(
    (SELECT count(*) FROM mailroom.mailboxes AS m JOIN b ON b.mailbox_id = m.id
        WHERE b.k = 'short' AND NOT m.is_active AND m.inactive_since = m.expires_at AND m.deleted_at IS NULL),
    5::bigint, 'expired mailboxes are inactive since their expires_at, not deleted'
);
SELECT ok(
    (SELECT bool_and(m.is_active) FROM mailroom.mailboxes AS m JOIN b ON b.mailbox_id = m.id WHERE b.k = 'long'),
    'mailboxes not yet due stay active'
);
SELECT throws_ok('SELECT mailroom.expire_mailboxes(0)', '22023', 'batch size must be positive, got 0',
    'batch size must be positive');
SELECT is(
    (SELECT count(*) FROM mailroom.messages AS g JOIN b ON b.mailbox_id = g.mailbox_id WHERE b.k = 'short'),
    10::bigint, 'expiry keeps the messages (it is a state transition)'
);

SELECT is(mailroom.seconds_until_next_expiry(), 1200::double precision, 'then the 30-minute ones, 20 minutes later');
SET LOCAL mailroom.clock = '2030-01-01 00:30:00+00';
SELECT is(mailroom.expire_mailboxes(), 3, 'the longer TTLs expire later');
SELECT is(mailroom.seconds_until_next_expiry(), NULL, 'no active inbox: nothing to wait for');

-- ---------------------------------------------------------------- purge with cascade
SET LOCAL mailroom.clock = '2030-01-08 00:09:59.999999+00';
SELECT is(mailroom.purge_mailboxes('7 days'), 1, 'only the mailbox deleted at 00:00 is past 7 days');
SET LOCAL mailroom.clock = '2030-01-08 00:10:00+00';
SELECT is(mailroom.purge_mailboxes('7 days', 3), 3, 'purge works in batches');
SELECT is(mailroom.purge_mailboxes('7 days', 3), 2, 'the rest of the due mailboxes');
SELECT is(
    (SELECT count(*) FROM mailroom.messages AS g JOIN b ON b.mailbox_id = g.mailbox_id WHERE b.k = 'short'),
    0::bigint, 'their messages went with them (the statement trigger, migration 0181)'
);
SELECT is(
    (SELECT count(*) FROM mailroom.mailboxes AS m JOIN b ON b.mailbox_id = m.id WHERE b.k = 'long'),
    3::bigint, 'mailboxes inactive for less than the retention stay'
);
SELECT is(
    (SELECT count(*) FROM mailroom.messages AS g JOIN b ON b.mailbox_id = g.mailbox_id WHERE b.k = 'long'),
    6::bigint, 'with their messages'
);
-- the link a foreign key kept, kept by triggers: no message without its mailbox, either way
SELECT throws_ok(
    $$INSERT INTO mailroom.messages (mailbox_id, raw, envelope_to, size_bytes, received_at)
      VALUES (-1, 'x', 'nobody@example.com', 1, mailroom.clock())$$,
    '23503', 'mailbox -1 does not exist', 'a message for no mailbox is refused (23503, as the foreign key did)'
);
SELECT throws_ok(
    $$UPDATE mailroom.messages SET mailbox_id = -1
      WHERE mailbox_id = (SELECT b.mailbox_id FROM b WHERE b.k = 'long' LIMIT 1)$$,
    '23503', NULL, 'nor moved to no mailbox'
);
DELETE FROM mailroom.mailboxes WHERE id = (SELECT b.mailbox_id FROM b WHERE b.k = 'long' ORDER BY 1 LIMIT 1);
SELECT is(
    (SELECT count(*) FROM mailroom.messages AS g JOIN b ON b.mailbox_id = g.mailbox_id WHERE b.k = 'long'),
    4::bigint, 'a plain DELETE of a mailbox (psql) takes its messages too'
);
SELECT throws_ok($$SELECT mailroom.purge_mailboxes('-1 day')$$, '22023',
    'retention must be a non-negative interval, got -1 days', 'negative retention is refused');
SELECT throws_ok($$SELECT mailroom.purge_mailboxes(NULL)$$, '22023',
    'retention must be a non-negative interval, got NULL', 'NULL retention is refused');

-- inbox_stats: what `mailroom status` shows of the inboxes (monitor and admin)
SELECT is(
    (SELECT open + expired_unswept + closed_unpurged FROM mailroom.inbox_stats()),
    (SELECT count(*) FROM mailroom.mailboxes),
    'inbox_stats: every inbox is open, past expiry unswept, or closed awaiting purge'
);
SELECT ok(
    has_function_privilege('mailroom_monitor', 'mailroom.inbox_stats()', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_app', 'mailroom.inbox_stats()', 'EXECUTE'),
    'the monitor reads inbox_stats; the application does not'
);

SELECT * FROM finish();
ROLLBACK;
