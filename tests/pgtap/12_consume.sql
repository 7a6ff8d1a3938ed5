-- verify_token and consume_token: every success and every error path, against the keyring (no key passed).
BEGIN;
SELECT plan(59);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: the claim and the dequeue take rows made by then, the
-- test's alone (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
-- old: a key the keyring does not hold (an attacker's, or a previous release's)
CREATE TEMP TABLE k (old bytea, active_id integer);
INSERT INTO k VALUES (decode(repeat('cd', 32), 'hex'), (SELECT id FROM mailroom.signing_keys WHERE state = 'active'));
-- a known secret and code for a dispatched token (what a dispatch mints), and its signed value
CREATE FUNCTION pg_temp.give_token(p_login text, p_action mailroom.token_action, p_secret bytea, p_code text)
RETURNS text LANGUAGE sql AS $$
    UPDATE mailroom.tokens AS t
    SET secret_digest = digest(p_secret, 'sha256'),
        code_digest = digest(p_secret || convert_to(p_code, 'UTF8'), 'sha256'),
        dispatched_at = mailroom.clock()
    FROM mailroom.accounts AS a
    WHERE a.id = t.account AND a.login = p_login AND t.action = p_action AND t.revoked_at IS NULL;
    SELECT mailroom.sign_token(p_action, p_secret, p_code);
$$;

-- activation: create, dequeue, consume
SELECT mailroom.create_account('act@example.com', 'act');
CREATE TEMP TABLE act AS SELECT * FROM mailroom.dequeue_tokens(10);
SELECT is((SELECT count(*)::int FROM act), 1, 'one activation token dequeued');

SELECT results_eq(
    $$ SELECT valid, action::text, key_id FROM mailroom.verify_token((SELECT signed FROM act)) $$,
    $$ VALUES (true, 'activation', (SELECT active_id FROM k)) $$, 'verify_token: valid activation value, the active key''s id');
SELECT results_eq(
    $$ SELECT valid, action::text, key_id
       FROM mailroom.verify_token(mailroom_internal._b64url_encode(gen_random_bytes(32) || gen_random_bytes(32))) $$,
    $$ VALUES (false, NULL::text, NULL::integer) $$, 'verify_token: a value no key of the keyring signed is invalid');
SELECT results_eq(
    $$ SELECT valid FROM mailroom.verify_token('not-a-token') $$,
    $$ VALUES (false) $$, 'verify_token: malformed value is invalid');
SELECT is(
    (SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY p.oid::regprocedure::text) FROM pg_proc AS p
     WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace) AND p.proname IN ('verify_token', 'consume_token')
         AND NOT ('bytea'::regtype = ANY(p.proargtypes))),
    'mailroom.consume_token(text,text), mailroom.verify_token(text,text)',
    'consume_token and verify_token take no key: (signed, code)'
);

-- the keyed forms of the previous release (one release): the passed keys are tried too
SELECT results_eq(
    $$ SELECT valid, action::text, key_index FROM mailroom.verify_token((SELECT signed FROM act), (SELECT old FROM k)) $$,
    $$ VALUES (true, 'activation', 0) $$, 'verify_token(signed, key) (deprecated): a keyring key matches as key_index 0');
SELECT throws_ok($$ SELECT * FROM mailroom.verify_token((SELECT signed FROM act), '\x01'::bytea) $$,
    'MR120', 'signing key missing or shorter than 32 bytes', 'verify_token (deprecated): short key');
SELECT throws_ok(
    $$ SELECT * FROM mailroom.verify_token((SELECT signed FROM act), (SELECT old FROM k), NULL, ARRAY['\x01'::bytea]) $$,
    'MR120', 'signing key missing or shorter than 32 bytes', 'verify_token (deprecated): short previous key');

SELECT throws_ok(
    format('SELECT mailroom.consume_token(%L)', mailroom_internal._b64url_encode(
        substr(mailroom_internal._b64url_decode((SELECT signed FROM act)), 1, 32)
        || hmac('/activate'::bytea || substr(mailroom_internal._b64url_decode((SELECT signed FROM act)), 1, 32), (SELECT old FROM k), 'sha256'))),
    'MR111', 'bad token signature', 'consume of the right secret signed with a key the keyring does not hold: bad signature');
SELECT throws_ok($$ SELECT mailroom.consume_token('abc') $$,
    'MR110', 'malformed token: expected 86 characters of URL-safe base64 without padding', 'too short');
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM act) || '==') $$,
    'MR110', NULL, 'padding is not accepted');
SELECT throws_ok(
    $$ SELECT mailroom.consume_token(
        'AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh/Ri3Yy9eHzSYzQ27mlxgmLvANFsuUMXQadIzL8Ldn/vg') $$,
    'MR110', NULL, 'the standard base64 alphabet (+/) is not accepted');
SELECT throws_ok($$ SELECT mailroom.consume_token(NULL) $$, 'MR110', NULL, 'NULL value');
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM act), NULL::bytea) $$,
    'MR120', 'signing key missing or shorter than 32 bytes', 'the deprecated keyed form: NULL key');

SELECT results_eq(
    $$ SELECT account, outcome, attempts_left FROM mailroom.consume_token((SELECT signed FROM act)) $$,
    $$ SELECT id, 'consumed', NULL::integer FROM mailroom.accounts WHERE login = 'act' $$,
    'consume returns one row: the account id, consumed, no attempt count for activation');
SELECT is((SELECT status FROM mailroom.accounts WHERE login = 'act'), 'active'::mailroom.account_status,
    'consuming the activation token activates the account');
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM act)) $$,
    'MR114', 'token already used', 'second consume: already used');

-- unknown: a correctly signed value for a secret the database never had
SELECT throws_ok(
    format('SELECT mailroom.consume_token(%L)', mailroom.sign_token('activation', gen_random_bytes(32), NULL)),
    'MR112', 'unknown token', 'unknown (validly signed) token');
SELECT throws_ok(
    format('SELECT mailroom.consume_token(%L)', mailroom_internal._b64url_encode(gen_random_bytes(64))),
    'MR111', 'bad token signature', 'random bytes: bad signature');

-- key rotation: a link signed before `keys rotate` verifies until its key is retired
SELECT mailroom.create_account('rot@example.com', 'rot');
CREATE TEMP TABLE rot AS SELECT * FROM mailroom.dequeue_tokens(10);
SELECT isnt(mailroom.rotate_signing_key(), (SELECT active_id FROM k), 'rotate: a new active key');
SELECT results_eq(
    $$ SELECT valid, key_id FROM mailroom.verify_token((SELECT signed FROM rot)) $$,
    $$ VALUES (true, (SELECT active_id FROM k)) $$, 'verify_token: the previous key (now verify-only) still verifies');
SELECT mailroom.retire_signing_key((SELECT active_id FROM k));
SELECT results_eq(
    $$ SELECT valid FROM mailroom.verify_token((SELECT signed FROM rot)) $$,
    $$ VALUES (false) $$, 'once retired it does not');
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM rot)) $$,
    'MR111', 'bad token signature', 'and consume refuses the link');
-- the previous release's collector signed with its own key: its links verify once that key is imported
SELECT mailroom.create_account('imp@example.com', 'imp');
CREATE TEMP TABLE imp AS SELECT * FROM mailroom.dequeue_tokens(10, (SELECT old FROM k));
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM imp)) $$,
    'MR111', 'bad token signature', 'a link signed with a key outside the keyring is refused');
SELECT is(
    (SELECT account FROM mailroom.consume_token((SELECT signed FROM imp), (SELECT old FROM k))),
    (SELECT id FROM mailroom.accounts WHERE login = 'imp'),
    'consume_token(signed, key) (deprecated) accepts it with the key an older application passes');
SELECT mailroom.create_account('imp2@example.com', 'imp2');
CREATE TEMP TABLE imp2 AS SELECT * FROM mailroom.dequeue_tokens(10, (SELECT old FROM k));
SELECT mailroom.import_signing_key((SELECT old FROM k));
SELECT is(
    (SELECT account FROM mailroom.consume_token((SELECT signed FROM imp2))),
    (SELECT id FROM mailroom.accounts WHERE login = 'imp2'),
    'after mailroom keys import, consume_token(signed) accepts it');

-- expired
SELECT mailroom.create_account('exp@example.com', 'exp');
CREATE TEMP TABLE exp AS SELECT * FROM mailroom.dequeue_tokens(10);
SET LOCAL mailroom.clock = '2000-01-01 00:15:00+00';
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM exp)) $$,
    'MR113', 'token expired', 'expired at expires_at (pinned clock)');
SET LOCAL mailroom.clock = '2000-01-01 00:14:59+00';
SELECT lives_ok($$ SELECT mailroom.consume_token((SELECT signed FROM exp)) $$,
    'one second earlier it is consumed');
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';

-- revoked: a reissued activation token supersedes the dispatched one
SELECT mailroom.create_account('rev@example.com', 'rev');
CREATE TEMP TABLE rev AS SELECT * FROM mailroom.dequeue_tokens(10);
INSERT INTO mailroom.tokens (account, action) SELECT id, 'activation' FROM mailroom.accounts WHERE login = 'rev';
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM rev)) $$,
    'MR117', 'token revoked: a newer token of the same kind was issued', 'revoked by reissue');
CREATE TEMP TABLE rev2 AS SELECT * FROM mailroom.dequeue_tokens(10);

-- account status: activation token of a suspended account
SELECT mailroom.create_account('sus@example.com', 'sus');
CREATE TEMP TABLE sus AS SELECT * FROM mailroom.dequeue_tokens(10);
SELECT mailroom.suspend_account((SELECT id FROM mailroom.accounts WHERE login = 'sus'));
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM sus)) $$,
    'MR118', format('account %s is suspended: its activation token cannot be used',
        (SELECT id FROM mailroom.accounts WHERE login = 'sus')),
    'activation token of a suspended account');
SELECT is((SELECT consumed_at FROM mailroom.tokens WHERE id = (SELECT token_id FROM sus)), NULL,
    'the refused token is left unconsumed');

-- password recovery: a known secret and code (pg_temp.give_token, as a dispatch would mint)
SELECT mailroom.create_account('rec@example.com', 'rec');
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'rec';
INSERT INTO mailroom.tokens (account, action) SELECT id, 'password_recovery' FROM mailroom.accounts WHERE login = 'rec';
CREATE TEMP TABLE rec AS
SELECT pg_temp.give_token('rec', 'password_recovery', decode(repeat('11', 32), 'hex'), '04242') AS signed,
    '04242'::text AS code,
    (SELECT t.id FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.login = 'rec' AND t.action = 'password_recovery') AS token_id;
SELECT is((SELECT code FROM rec), '04242', 'recovery token with its code');
SELECT results_eq(
    $$ SELECT valid, action::text FROM mailroom.verify_token((SELECT signed FROM rec), '04242') $$,
    $$ VALUES (true, 'password_recovery') $$, 'verify_token: recovery value with its code');
SELECT results_eq(
    $$ SELECT valid FROM mailroom.verify_token((SELECT signed FROM rec)) $$,
    $$ VALUES (false) $$, 'verify_token: a recovery value without its code does not verify');
SELECT results_eq(
    $$ SELECT valid FROM mailroom.verify_token((SELECT signed FROM rec), '04243') $$,
    $$ VALUES (false) $$, 'verify_token: a recovery value with another code does not verify');

SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM rec)) $$,
    'MR119', 'a password-recovery token needs its 5-digit code', 'recovery without a code');
-- a wrong code is a result row (it commits with the caller's transaction), not an error
SELECT results_eq(
    $$ SELECT account, outcome, attempts_left FROM mailroom.consume_token((SELECT signed FROM rec), '00000') $$,
    $$ VALUES (NULL::bigint, 'wrong_code', 4) $$,
    'recovery with a wrong code: (NULL, wrong_code, 4 attempts left)');
SELECT results_eq(
    $$ SELECT outcome, attempts_left FROM mailroom.consume_token((SELECT signed FROM rec), 'abcde') $$,
    $$ VALUES ('wrong_code', 3) $$,
    'a non-numeric code is a wrong code and counts');
SELECT is((SELECT code_attempts FROM mailroom.tokens WHERE id = (SELECT token_id FROM rec)), 2,
    'both wrong codes are counted on the token');
SELECT throws_ok(
    format('SELECT mailroom.consume_token(%L, %L)', mailroom_internal._b64url_encode(decode(repeat('11', 32), 'hex')
        || hmac('/recover'::bytea || decode(repeat('11', 32), 'hex') || '04242'::bytea, decode(repeat('ef', 32), 'hex'), 'sha256')),
        '04242'),
    'MR111', 'bad token signature', 'recovery with the right code but signed with another key');
SELECT is((SELECT consumed_at FROM mailroom.tokens WHERE id = (SELECT token_id FROM rec)), NULL,
    'the refused token is left unconsumed');

-- five tries: the fifth wrong code leaves none, then even the right code is refused
CREATE TEMP TABLE tries AS
SELECT g, c.outcome, c.attempts_left
FROM generate_series(3, 5) AS g,
    LATERAL mailroom.consume_token((SELECT signed FROM rec), '9999' || g) AS c;
SELECT results_eq(
    $$ SELECT g, outcome, attempts_left FROM tries ORDER BY g $$,
    $$ VALUES (3, 'wrong_code', 2), (4, 'wrong_code', 1), (5, 'wrong_code', 0) $$,
    'wrong codes 3 to 5 leave 2, 1, 0 attempts');
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM rec), '04242') $$,
    'MR116', 'token locked after 5 wrong codes', 'after the fifth wrong code even the right code is refused');
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM rec), '99999') $$,
    'MR116', 'token locked after 5 wrong codes', 'and a sixth wrong code is refused, not counted');
SELECT is((SELECT code_attempts FROM mailroom.tokens WHERE id = (SELECT token_id FROM rec)), 5,
    'the count stops at tokens.max_code_attempts');

-- the right code after four wrong ones: the fifth attempt consumes
UPDATE mailroom.tokens SET code_attempts = 4 WHERE id = (SELECT token_id FROM rec);
SELECT results_eq(
    $$ SELECT account, outcome, attempts_left FROM mailroom.consume_token((SELECT signed FROM rec), '04242') $$,
    $$ SELECT id, 'consumed', 0 FROM mailroom.accounts WHERE login = 'rec' $$,
    'the right code on the 5th attempt consumes (account, consumed, 0 attempts left)');
SELECT is((SELECT code_attempts FROM mailroom.tokens WHERE id = (SELECT token_id FROM rec)), 5,
    'the successful attempt was counted too');
SELECT is((SELECT status FROM mailroom.accounts WHERE login = 'rec'), 'active'::mailroom.account_status,
    'consuming a recovery token leaves the account active');
SELECT throws_ok($$ SELECT mailroom.consume_token((SELECT signed FROM rec), '04242') $$,
    'MR114', 'token already used', 'a recovery token is single use');

-- recovery token of an account suspended after the request
SELECT mailroom.create_account('rs@example.com', 'rs');
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'rs';
INSERT INTO mailroom.tokens (account, action) SELECT id, 'password_recovery' FROM mailroom.accounts WHERE login = 'rs';
CREATE TEMP TABLE rs AS SELECT * FROM mailroom.dequeue_tokens(10);
SELECT mailroom.suspend_account((SELECT id FROM mailroom.accounts WHERE login = 'rs'));
SELECT throws_ok(
    $$ SELECT mailroom.consume_token((SELECT signed FROM rs), (SELECT code FROM rs)) $$,
    'MR118', NULL, 'recovery token of a suspended account');
SELECT throws_ok(
    $$ SELECT mailroom.consume_token((SELECT signed FROM rs), '99999') $$,
    'MR118', NULL, 'a wrong code on a suspended account is refused by status before the code is compared');
SELECT is((SELECT code_attempts FROM mailroom.tokens WHERE id = (SELECT token_id FROM rs)), 0,
    'so nothing is counted for it');

-- (the two-session part of this file is tests/pgtap_sessions/12_consume_sessions.sql: it commits)

-- no autonomous transaction: nothing in mailroom uses dblink, and its leftovers are gone
SELECT is(
    (SELECT coalesce(string_agg(p.oid::regprocedure::text, ', '), '') FROM pg_proc AS p
     WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace) AND p.prosrc ~* 'dblink'),
    '', 'no function in schema mailroom calls dblink'
);
SELECT hasnt_function('mailroom_internal', '_count_code_attempt', 'the loopback attempt counter is gone');
SELECT hasnt_function('mailroom_internal', '_loopback_conninfo', 'the loopback conninfo helper is gone');
SELECT is((SELECT count(*)::int FROM mailroom.settings WHERE name = 'tokens.loopback_conninfo'), 0,
    'the setting tokens.loopback_conninfo is gone');

-- messages never carry the secret value or an address
SELECT ok(
    NOT EXISTS (
        SELECT 1 FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
        WHERE n.nspname IN ('mailroom', 'mailroom_internal') AND p.proname IN ('consume_token', '_consume_token', '_raise_token_state')
          AND prosrc ~ 'MESSAGE = format\([^)]*(p_signed|email)'
    ),
    'error messages are not built from the signed value or an email address'
);

-- constant-time helper
SELECT ok(mailroom_internal._ct_equal('\x0102', '\x0102') AND NOT mailroom_internal._ct_equal('\x0102', '\x0103')
    AND NOT mailroom_internal._ct_equal('\x01', '\x0102') AND NOT coalesce(mailroom_internal._ct_equal(NULL, '\x01'), false),
    '_ct_equal compares whole values');

-- the state rule on a row already read (consume_token asks it of the row it locked, not reading it
-- again): a row that was not found (its fields NULL: gone between the digest's look-up and the lock)
SELECT throws_ok(
    $$SELECT mailroom_internal._raise_token_row_state(NULL::mailroom.tokens)$$, 'MR112', 'unknown token',
    '_raise_token_row_state: a row not found is an unknown token'
);

SELECT * FROM finish();
ROLLBACK;
