-- consume_token across sessions (dblink): the code-attempt count commits with the caller's transaction, and
-- consume_token against suspend_account. Moved out of tests/pgtap/12_consume.sql: it commits rows through a
-- second session, so it runs only on the test cluster (`python -m mailroom.testing pgtap`), never by `db verify`.
BEGIN;
SELECT plan(14);

-- The count commits with the caller's transaction. Another session (dblink) runs the wrong codes
-- in a transaction that commits, as an application does; its rows are committed, so they are
-- created dispatched (never dequeued by another test) and deleted at the end.
SET LOCAL client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS dblink;
CREATE TEMP TABLE burn (login text, signed text);
SELECT dblink_connect('client', format(
    'dbname=%s port=%s host=%s user=%s', current_database(), current_setting('port'),
    coalesce(nullif(split_part(current_setting('unix_socket_directories'), ',', 1), ''), 'localhost'),
    current_user
));
-- the other session sees the committed keyring (this transaction rotated it): sign with its active key
CREATE TEMP TABLE remote_key AS
SELECT key FROM dblink('client', $$SELECT key FROM mailroom.signing_keys WHERE state = 'active'$$) AS r (key bytea);
CREATE FUNCTION pg_temp.remote_sign(p_secret bytea) RETURNS text LANGUAGE sql AS $$
    SELECT (mailroom_internal._signed_values(
        ARRAY['password_recovery'::mailroom.token_action], ARRAY[p_secret], ARRAY['04242'], (SELECT key FROM remote_key)
    ))[1]
$$;
INSERT INTO burn
SELECT l, pg_temp.remote_sign(decode(repeat(h, 32), 'hex'))
FROM (VALUES ('burn5', '51'), ('burn4', '52')) AS v (l, h);
SELECT dblink_exec('client', $$
    INSERT INTO mailroom.accounts (email, login, status)
    VALUES ('burn5@commit.test', 'burn5', 'active'), ('burn4@commit.test', 'burn4', 'active');
    INSERT INTO mailroom.tokens (account, action)
    SELECT a.id, 'password_recovery' FROM mailroom.accounts AS a WHERE a.login IN ('burn5', 'burn4');
    UPDATE mailroom.tokens AS t SET dispatched_at = t.created_at,
        secret_digest = digest(decode(repeat(v.h, 32), 'hex'), 'sha256'),
        code_digest = digest(decode(repeat(v.h, 32), 'hex') || '04242'::bytea, 'sha256')
    FROM mailroom.accounts AS a INNER JOIN (VALUES ('burn5', '51'), ('burn4', '52')) AS v (l, h) ON a.login = v.l
    WHERE a.id = t.account AND t.action = 'password_recovery'
$$);
CREATE FUNCTION pg_temp.remote_consume(p_login text, p_code text)
RETURNS TABLE (account bigint, outcome text, attempts_left integer) LANGUAGE sql AS $$
    SELECT * FROM dblink('client', format(
        'SELECT * FROM mailroom.consume_token(%L, %L)',
        (SELECT signed FROM burn WHERE login = p_login), p_code
    )) AS r (account bigint, outcome text, attempts_left integer)
$$;

SELECT dblink_exec('client', 'BEGIN');
SELECT results_eq(
    $$ SELECT g, c.outcome, c.attempts_left FROM generate_series(1, 5) AS g,
       LATERAL pg_temp.remote_consume('burn5', lpad(g::text, 5, '0')) AS c ORDER BY g $$,
    $$ VALUES (1, 'wrong_code', 4), (2, 'wrong_code', 3), (3, 'wrong_code', 2), (4, 'wrong_code', 1),
              (5, 'wrong_code', 0) $$,
    'another session: five wrong codes in one transaction, each a wrong_code row'
);
SELECT dblink_exec('client', 'COMMIT');
SELECT is(
    (SELECT t.code_attempts FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.login = 'burn5'),
    5, 'its transaction committed, and the five attempts with it'
);
SELECT throws_ok(
    $$ SELECT * FROM pg_temp.remote_consume('burn5', '04242') $$,
    'MR116', 'token locked after 5 wrong codes',
    'then the right code is refused: the token is burnt'
);

SELECT dblink_exec('client', 'BEGIN');
SELECT is(
    (SELECT count(*)::int FROM generate_series(1, 4) AS g, LATERAL pg_temp.remote_consume('burn4', lpad(g::text, 5, '0')) AS c
     WHERE c.outcome = 'wrong_code'),
    4, 'another session: four wrong codes in one transaction'
);
SELECT dblink_exec('client', 'COMMIT');
SELECT results_eq(
    $$ SELECT c.outcome, c.attempts_left, c.account = a.id
       FROM pg_temp.remote_consume('burn4', '04242') AS c, mailroom.accounts AS a WHERE a.login = 'burn4' $$,
    $$ VALUES ('consumed', 0, true) $$,
    'then the right code consumes the token'
);

-- consume_token against suspend_account: the account row is locked first by both, so exactly
-- one of them goes first and the other sees its result. Two more sessions: 'holder' runs one
-- side in an open transaction, 'client' runs the other asynchronously and must wait for it.
SELECT dblink_connect('holder', format(
    'dbname=%s port=%s host=%s user=%s', current_database(), current_setting('port'),
    coalesce(nullif(split_part(current_setting('unix_socket_directories'), ',', 1), ''), 'localhost'),
    current_user
));
SELECT dblink_exec('client', $$SET statement_timeout = '20s'$$);
SELECT dblink_exec('holder', $$SET statement_timeout = '20s'$$);
INSERT INTO burn
SELECT l, pg_temp.remote_sign(decode(repeat(h, 32), 'hex'))
FROM (VALUES ('race1', '61'), ('race2', '62')) AS v (l, h);
SELECT dblink_exec('client', $$
    INSERT INTO mailroom.accounts (email, login, status)
    VALUES ('race1@commit.test', 'race1', 'active'), ('race2@commit.test', 'race2', 'active');
    INSERT INTO mailroom.tokens (account, action)
    SELECT a.id, 'password_recovery' FROM mailroom.accounts AS a WHERE a.login IN ('race1', 'race2');
    UPDATE mailroom.tokens AS t SET dispatched_at = t.created_at,
        secret_digest = digest(decode(repeat(v.h, 32), 'hex'), 'sha256'),
        code_digest = digest(decode(repeat(v.h, 32), 'hex') || '04242'::bytea, 'sha256')
    FROM mailroom.accounts AS a INNER JOIN (VALUES ('race1', '61'), ('race2', '62')) AS v (l, h) ON a.login = v.l
    WHERE a.id = t.account AND t.action = 'password_recovery'
$$);
-- true once the session's backend waits for a lock (polls for at most 10 s)
CREATE TEMP TABLE pids AS
SELECT c AS conn, (SELECT pid FROM dblink(c, 'SELECT pg_backend_pid()') AS r (pid integer)) AS pid
FROM unnest(ARRAY['client', 'holder']) AS c;
CREATE FUNCTION pg_temp.waits_for_lock(p_conn text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. 200 LOOP
        IF EXISTS (
            SELECT 1 FROM pg_stat_activity AS a INNER JOIN pids AS p ON a.pid = p.pid
            WHERE p.conn = p_conn AND a.wait_event_type = 'Lock'
        ) THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END;
$$;

-- 1. suspend first: the consume waits for it, then refuses (MR118), nothing is consumed
SELECT dblink_exec('holder', 'BEGIN');
SELECT * FROM dblink(
    'holder', $$SELECT mailroom.suspend_account(id)::text FROM mailroom.accounts WHERE login = 'race1'$$
) AS r (status text);
SELECT dblink_send_query('client', format(
    'SELECT * FROM mailroom.consume_token(%L, %L)',
    (SELECT signed FROM burn WHERE login = 'race1'), '04242'
));
SELECT ok(pg_temp.waits_for_lock('client'), 'a consume of a recovery token waits for a suspend of its account in flight');
SELECT dblink_exec('holder', 'COMMIT');
SELECT throws_ok(
    $$ SELECT * FROM dblink_get_result('client') AS r (account bigint, outcome text, attempts_left integer) $$,
    'MR118', format('account %s is suspended: its password_recovery token cannot be used',
        (SELECT id FROM mailroom.accounts WHERE login = 'race1')),
    'then it sees the suspension and refuses'
);
SELECT is(
    (SELECT count(*)::int FROM dblink_get_result('client') AS r (account bigint, outcome text, attempts_left integer)),
    0, '(no further result)'
);
SELECT results_eq(
    $$ SELECT a.status::text, t.consumed_at IS NULL, t.code_attempts FROM mailroom.tokens AS t
       JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'race1' $$,
    $$ VALUES ('suspended', true, 0) $$,
    'suspended, token not consumed, no attempt counted'
);

-- 2. consume first: the suspend waits until the token is used, then suspends
SELECT dblink_exec('client', 'BEGIN');
SELECT is(
    (SELECT outcome FROM pg_temp.remote_consume('race2', '04242')), 'consumed',
    'a consume in an open transaction'
);
SELECT dblink_send_query(
    'holder', $$SELECT mailroom.suspend_account(id)::text FROM mailroom.accounts WHERE login = 'race2'$$
);
SELECT ok(pg_temp.waits_for_lock('holder'), 'a suspend of the account waits for the consume in flight');
SELECT dblink_exec('client', 'COMMIT');
SELECT is(
    (SELECT s FROM dblink_get_result('holder') AS r (s text)), 'suspended', 'then suspends the account'
);
SELECT is(
    (SELECT count(*)::int FROM dblink_get_result('holder') AS r (s text)), 0, '(no further result)'
);
SELECT results_eq(
    $$ SELECT a.status::text, t.consumed_at IS NOT NULL FROM mailroom.tokens AS t
       JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'race2' $$,
    $$ VALUES ('suspended', true) $$,
    'the token was used before the account was suspended, in that order'
);

SELECT dblink_exec('client', $$DELETE FROM mailroom.accounts WHERE email LIKE '%@commit.test'$$);
SELECT dblink_disconnect('client');
SELECT dblink_disconnect('holder');

SELECT * FROM finish();
ROLLBACK;
