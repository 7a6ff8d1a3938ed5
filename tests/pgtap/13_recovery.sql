-- Password recovery (sql/13_recovery.sql): the request records itself and nothing else, whatever
-- the address; dequeue_tokens issues the tokens the recovery policy allows: per requester a cap
-- and a spacing, per account a daily cap then one per capped interval, so a stranger's requests
-- never lock the owner out (issue 21, items 6 and 7).
BEGIN;
SELECT plan(35);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: the claim and the dequeue take rows made by then, the
-- test's alone (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
SELECT mailroom.create_account('act@example.com', 'act');
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'act';
SELECT mailroom.create_account('prov@example.com', 'prov');
SELECT mailroom.create_account('sus@example.com', 'sus');
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'sus';
UPDATE mailroom.accounts SET status = 'suspended' WHERE login = 'sus';
SELECT mailroom.create_account('own@example.com', 'own');
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'own';
SELECT mailroom.create_account('anon@example.com', 'anon');
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'anon';

CREATE FUNCTION pg_temp.recoveries(p_login text) RETURNS integer LANGUAGE sql AS $$
    SELECT count(*)::int FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
    WHERE a.login = p_login AND t.action = 'password_recovery'
$$;
-- a request at a given time, then the collector's step (what dequeue_tokens does first)
CREATE FUNCTION pg_temp.ask(p_at timestamptz, p_email text, p_requester text DEFAULT null) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('mailroom.clock', p_at::text, true);
    PERFORM mailroom.request_password_recovery(p_email, p_requester);
    PERFORM mailroom_internal._issue_requested_recoveries(100);
END;
$$;

SELECT is(mailroom.setting('recovery.min_interval'), '60 seconds', 'default spacing per requester 60 s');
SELECT is(mailroom.setting('recovery.daily_cap'), '10', 'default cap per account 10 a day');
SELECT is(mailroom.setting('recovery.requester_daily_cap'), '3', 'default cap per requester and account 3 a day');
SELECT is(mailroom.setting('recovery.capped_interval'), '1 hour', 'past the daily cap, one an hour');

-- ---------------------------------------------------------------- the request: the same for every address
SELECT results_eq(
    $$ SELECT mailroom.request_password_recovery(e)::text
       FROM unnest(ARRAY['ACT@example.com', 'prov@example.com', 'sus@example.com', 'nobody@example.com']) AS e $$,
    $$ VALUES (''), (''), (''), ('') $$,
    'active, provisioned, suspended and unknown addresses all get the same empty answer'
);
SELECT is((SELECT count(*)::int FROM mailroom.recovery_requests WHERE handled_at IS NULL
    AND lower(email) IN ('act@example.com', 'prov@example.com', 'sus@example.com', 'nobody@example.com')), 4,
    'each request is recorded, pending, whatever the address');
SELECT is((SELECT count(*)::int FROM mailroom.tokens WHERE action = 'password_recovery' AND created_at <= mailroom.clock()), 0,
    'the request itself issues nothing');
SELECT doesnt_match(pg_get_functiondef('mailroom.request_password_recovery(text, text)'::regprocedure),
    'mailroom\.(accounts|tokens)\M', 'the request does not look at accounts or tokens: nothing depends on the address');
SELECT is(mailroom_internal._issue_requested_recoveries(100), 1, 'the collector''s step issues one token');
SELECT is(pg_temp.recoveries('act'), 1, 'for the active account (email matched case-insensitively)');
SELECT is(pg_temp.recoveries('prov') + pg_temp.recoveries('sus'), 0, 'none for provisioned or suspended accounts');
SELECT is((SELECT count(*)::int FROM mailroom.recovery_requests WHERE requested_at <= mailroom.clock()), 1,
    'requests that issued nothing are gone; the issued one is kept for the policy');
SELECT is((SELECT count(*)::int FROM mailroom.recovery_requests WHERE email IS NOT NULL AND requested_at <= mailroom.clock()), 0,
    'no requested address is kept once handled');
SELECT throws_ok($$ SELECT mailroom.request_password_recovery('no-at-sign') $$,
    'MR101', 'invalid email address', 'a malformed address is refused (this reveals nothing)');
SELECT throws_ok($$ SELECT mailroom.request_password_recovery('a@example.com', repeat('x', 1001)) $$,
    '22023', NULL, 'a requester fingerprint over 1000 bytes is refused');

-- ---------------------------------------------------------------- spacing per requester
SELECT pg_temp.ask('2000-01-01 00:00:59+00', 'act@example.com');
SELECT is(pg_temp.recoveries('act'), 1, 'a second anonymous request 59 s later issues nothing');
SELECT pg_temp.ask('2000-01-01 00:01:00+00', 'act@example.com');
SELECT is(pg_temp.recoveries('act'), 2, 'one 60 s later does');
SELECT is(
    (SELECT count(*)::int FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.login = 'act' AND t.action = 'password_recovery' AND t.revoked_at IS NULL),
    1, 'the new token revokes the older one: the newest mail holds the valid link');
SELECT pg_temp.ask('2000-01-01 00:01:01+00', 'act@example.com', 'ip:198.51.100.7');
SELECT is(pg_temp.recoveries('act'), 3, 'another requester is not held by the anonymous requests'' spacing');

-- ---------------------------------------------------------------- a stranger cannot lock the owner out
SELECT pg_temp.ask(('2000-01-01 10:00:00+00'::timestamptz + n * interval '1 minute'), 'own@example.com', 'ip:203.0.113.66')
FROM generate_series(0, 4) AS n;
SELECT is(pg_temp.recoveries('own'), 3, 'a stranger''s five requests, a minute apart, issue three (recovery.requester_daily_cap)');
SELECT pg_temp.ask('2000-01-01 10:06:00+00', 'own@example.com', 'ip:192.0.2.10');
SELECT is(pg_temp.recoveries('own'), 4, 'the owner''s own request right after still issues a token');
SELECT ok(
    (SELECT t.revoked_at IS NULL AND t.consumed_at IS NULL AND t.expires_at > '2000-01-01 10:06:00+00'
     FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.login = 'own' AND t.action = 'password_recovery' ORDER BY t.id DESC LIMIT 1),
    'and it is the valid one');
SELECT pg_temp.ask(('2000-01-01 11:00:00+00'::timestamptz + n * interval '1 minute'), 'anon@example.com')
FROM generate_series(0, 4) AS n;
SELECT pg_temp.ask('2000-01-01 11:06:00+00', 'anon@example.com');
SELECT is(pg_temp.recoveries('anon'), 6,
    'anonymous: after five strangers'' requests a minute apart the owner''s sixth still issues one (daily cap 10)');

-- ---------------------------------------------------------------- the bound on mail to one address
SELECT pg_temp.ask(('2000-01-01 12:00:00+00'::timestamptz + n * interval '1 second'), 'own@example.com', 'ip:10.0.0.' || n)
FROM generate_series(1, 10) AS n;
SELECT is(pg_temp.recoveries('own'), 10, 'many requesters together: at most recovery.daily_cap in 24 h');
SELECT pg_temp.ask('2000-01-01 12:59:00+00', 'own@example.com', 'ip:10.0.1.1');
SELECT is(pg_temp.recoveries('own'), 10, 'past the cap, nothing within recovery.capped_interval of the last one');
SELECT pg_temp.ask('2000-01-01 13:00:07+00', 'own@example.com', 'ip:10.0.1.2');
SELECT is(pg_temp.recoveries('own'), 11, 'one per recovery.capped_interval after that: the owner waits an hour at most');
SELECT pg_temp.ask('2000-01-01 13:00:08+00', 'own@example.com', 'ip:10.0.1.3');
SELECT is(pg_temp.recoveries('own'), 11, 'and only one');
SELECT pg_temp.ask('2000-01-02 09:59:59+00', 'own@example.com', 'ip:203.0.113.66');
SELECT is(pg_temp.recoveries('own'), 11, 'the stranger''s own cap still holds within its 24 h');
SELECT pg_temp.ask('2000-01-02 10:04:01+00', 'own@example.com', 'ip:203.0.113.66');
SELECT is(pg_temp.recoveries('own'), 12, 'a day after its first, the stranger may ask again');

-- ---------------------------------------------------------------- stale requests, the collector
SET LOCAL mailroom.clock = '2000-01-03 00:00:00+00';
SELECT mailroom.request_password_recovery('act@example.com', 'late');
SET LOCAL mailroom.clock = '2000-01-03 00:15:01+00';
SELECT is(mailroom_internal._issue_requested_recoveries(100), 0, 'a request older than tokens.ttl issues nothing');
SELECT is((SELECT count(*)::int FROM mailroom.recovery_requests WHERE handled_at IS NULL AND requested_at <= mailroom.clock()), 0,
    'and is gone');
SET LOCAL mailroom.clock = '2000-01-03 01:00:00+00';
SELECT count(*) FROM mailroom.dequeue_tokens(100);  -- what is due already
SELECT mailroom.request_password_recovery('act@example.com');
SELECT is(
    (SELECT count(*)::int FROM mailroom.dequeue_tokens(10)), 0,
    'dequeue_tokens issues the requested token but does not hand it out in that call (it exists for others only at commit)'
);
SELECT results_eq(
    $$ SELECT action::text, login, code ~ '^[0-9]{5}$'
       FROM mailroom.dequeue_tokens(10) $$,
    $$ VALUES ('password_recovery', 'act', true) $$,
    'the next call hands it out, with its code'
);
SET LOCAL mailroom.clock = '2000-01-06 00:00:00+00';
SELECT mailroom_internal._issue_requested_recoveries(1);
SELECT is((SELECT count(*)::int FROM mailroom.recovery_requests WHERE handled_at < '2000-01-04 00:00:00+00'), 0,
    'issued requests leave two days after they were handled');

-- a request is handled once made (requested_at <= clock): a collector pinned before it leaves it
-- pending, as db verify's files, pinned before any installation existed, leave the installation's
SET LOCAL mailroom.clock = '2000-02-01 00:00:00+00';
SELECT mailroom.request_password_recovery('act@example.com', 'made later');
SET LOCAL mailroom.clock = '2000-01-31 00:00:00+00';
SELECT mailroom_internal._issue_requested_recoveries(100);
SELECT is(
    (SELECT count(*)::int FROM mailroom.recovery_requests WHERE handled_at IS NULL AND requested_at = '2000-02-01 00:00:00+00'),
    1, 'a request is not handled before it was made'
);
SELECT * FROM finish();
ROLLBACK;
