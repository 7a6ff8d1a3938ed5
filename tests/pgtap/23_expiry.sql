-- Expiry counts and batches, purge with cascade. The concurrent lock path (SKIP LOCKED, a second real
-- session through dblink) is tests/pgtap_sessions/23_expiry_sessions.sql.
BEGIN;
SELECT plan(25);
\ir fixtures/default_settings.sql

SET LOCAL client_min_messages = warning;

-- ---------------------------------------------------------------- counts and batches
-- the clock before any installation existed: the sweep and the purge meet this test's inboxes alone
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
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

SET LOCAL mailroom.clock = '2000-01-01 00:10:00+00';
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
SET LOCAL mailroom.clock = '2000-01-01 00:30:00+00';
SELECT is(mailroom.expire_mailboxes(), 3, 'the longer TTLs expire later');
-- (NULL on a fresh database; on a used one, the installation's own inboxes, which expire after 2000)
SELECT is(
    mailroom.seconds_until_next_expiry(),
    (SELECT extract(EPOCH FROM min(m.expires_at) - mailroom.clock())::double precision FROM mailroom.mailboxes AS m
     WHERE m.is_active AND m.id NOT IN (SELECT b.mailbox_id FROM b)),
    'no active inbox: nothing to wait for'
);

-- ---------------------------------------------------------------- purge with cascade
SET LOCAL mailroom.clock = '2000-01-08 00:09:59.999999+00';
SELECT is(mailroom.purge_mailboxes('7 days'), 1, 'only the mailbox deleted at 00:00 is past 7 days');
SET LOCAL mailroom.clock = '2000-01-08 00:10:00+00';
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
