-- request_password_recovery: eligibility, rate limits, no enumeration.
BEGIN;
SELECT plan(19);

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
SELECT mailroom.create_account('act@example.com', 'act');
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'act';
SELECT mailroom.create_account('prov@example.com', 'prov');
SELECT mailroom.create_account('sus@example.com', 'sus');
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'sus';
UPDATE mailroom.accounts SET status = 'suspended' WHERE login = 'sus';

CREATE FUNCTION pg_temp.recoveries(p_login text) RETURNS integer LANGUAGE sql AS $$
    SELECT count(*)::int FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
    WHERE a.login = p_login AND t.action = 'password_recovery'
$$;

SELECT is(mailroom.setting('recovery.min_interval'), '60 seconds', 'default minimum interval 60 s');
SELECT is(mailroom.setting('recovery.daily_cap'), '5', 'default daily cap 5');

-- the same (void) answer for every kind of address
SELECT results_eq(
    $$ SELECT mailroom.request_password_recovery(e)::text
       FROM unnest(ARRAY['ACT@example.com', 'prov@example.com', 'sus@example.com', 'nobody@example.com']) AS e $$,
    $$ VALUES (''), (''), (''), ('') $$,
    'active, provisioned, suspended and unknown addresses all get the same empty answer'
);
SELECT is(pg_temp.recoveries('act'), 1, 'a token for the active account (email matched case-insensitively)');
SELECT is(pg_temp.recoveries('prov'), 0, 'no token for a provisioned account');
SELECT is(pg_temp.recoveries('sus'), 0, 'no token for a suspended account');
SELECT is((SELECT count(*)::int FROM mailroom.tokens WHERE action = 'password_recovery'), 1,
    'nothing at all for an unknown address');
SELECT throws_ok($$ SELECT mailroom.request_password_recovery('no-at-sign') $$,
    'MR101', 'invalid email address', 'a malformed address is refused (this reveals nothing)');

-- per-account rate limit: one per recovery.min_interval
SET LOCAL mailroom.clock = '2030-01-01 00:00:59+00';
SELECT lives_ok($$ SELECT mailroom.request_password_recovery('act@example.com') $$, 'a second request 59 s later');
SELECT is(pg_temp.recoveries('act'), 1, 'is silently rate-limited');
SET LOCAL mailroom.clock = '2030-01-01 00:01:00+00';
SELECT mailroom.request_password_recovery('act@example.com');
SELECT is(pg_temp.recoveries('act'), 2, 'a request 60 s later issues a new token');
SELECT is(
    (SELECT count(*)::int FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.login = 'act' AND t.action = 'password_recovery' AND t.revoked_at IS NULL),
    1, 'the new token revokes the older one');

-- daily cap
SELECT mailroom.set_setting('recovery.min_interval', '0 seconds');
SET LOCAL mailroom.clock = '2030-01-01 00:02:00+00';
SELECT mailroom.request_password_recovery('act@example.com');
SET LOCAL mailroom.clock = '2030-01-01 00:03:00+00';
SELECT mailroom.request_password_recovery('act@example.com');
SET LOCAL mailroom.clock = '2030-01-01 00:04:00+00';
SELECT mailroom.request_password_recovery('act@example.com');
SELECT is(pg_temp.recoveries('act'), 5, 'five tokens within the day');
SET LOCAL mailroom.clock = '2030-01-01 00:05:00+00';
SELECT mailroom.request_password_recovery('act@example.com');
SELECT is(pg_temp.recoveries('act'), 5, 'the sixth within 24 h is refused (daily cap)');
SET LOCAL mailroom.clock = '2030-01-02 00:00:01+00';
SELECT mailroom.request_password_recovery('act@example.com');
SELECT is(pg_temp.recoveries('act'), 6, 'a day after the first, one is allowed again');
SELECT mailroom.set_setting('recovery.daily_cap', '100');
SET LOCAL mailroom.clock = '2030-01-02 00:00:02+00';
SELECT mailroom.request_password_recovery('act@example.com');
SELECT is(pg_temp.recoveries('act'), 7, 'the cap is read from the setting');

-- the issued token is dequeued as a recovery token with a code
SELECT results_eq(
    $$ SELECT action::text, login, code ~ '^[0-9]{5}$' FROM mailroom.dequeue_tokens(10, decode(repeat('ab', 32), 'hex')) $$,
    $$ VALUES ('password_recovery', 'act', true) $$,
    'the latest (unrevoked) recovery token is dequeued with its code'
);

-- comparable work: both paths read the same rows and draw the same random material
SELECT matches(pg_get_functiondef('mailroom.request_password_recovery(text)'::regprocedure),
    '_random_bytes\(32\)[\s\S]*_random_code\(\)[\s\S]*IF v_status = ''active''',
    'secret and code are generated before deciding whether to use them');
SELECT lives_ok($$ SELECT mailroom.request_password_recovery('Nobody.Else@Example.org') $$,
    'unknown address: no error');

SELECT * FROM finish();
ROLLBACK;
