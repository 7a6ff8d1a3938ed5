-- Tokens: codes, signed values (the keyring's active key), minting at dispatch, revocation, dequeue eligibility, expiry, no plaintext at rest.
-- The dequeue's plans (ANALYZE, indexes dropped): tests/pgtap_fresh/11_tokens_plans.sql, on the test cluster only.
-- The clock is pinned before any installation existed: the dequeue takes tokens made by then (the
-- test's alone) and closes none of the installation's (docs/operations.md, "Verifying an installation").
BEGIN;
SELECT plan(70);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
CREATE TEMP TABLE k (key bytea);
INSERT INTO k VALUES (decode(repeat('cafebabe', 8), 'hex'));

-- CSPRNG codes: always 5 digits, spread over the whole range
CREATE TEMP TABLE codes AS SELECT mailroom_internal._random_code() AS code FROM generate_series(1, 10000);
SELECT is((SELECT count(*)::int FROM codes WHERE code ~ '^[0-9]{5}$'), 10000, '10,000 codes all match ^[0-9]{5}$');
SELECT cmp_ok((SELECT count(DISTINCT left(code, 1))::int FROM codes), '=', 10, 'every leading digit occurs');
SELECT cmp_ok((SELECT count(DISTINCT code)::int FROM codes), '>', 9000, 'codes are not repeating (> 9,000 distinct of 10,000)');
SELECT ok(
    (SELECT bool_and(n BETWEEN 850 AND 1150) FROM (SELECT count(*) AS n FROM codes GROUP BY left(code, 1)) AS c),
    'each leading digit about 1,000 times in 10,000 (uniform)'
);
SELECT unalike(pg_get_functiondef('mailroom_internal._random_code'::regproc), '%random()%', 'codes do not use random()');

-- signature vectors: expected values computed independently (Python hmac/base64), under a key
-- imported into the keyring as its active key
SELECT isnt(mailroom.import_signing_key((SELECT key FROM k), true), NULL, 'a known key imported as the active key');
SELECT is(
    mailroom.sign_token('activation', '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f', NULL),
    'AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh_Ri3Yy9eHzSYzQ27mlxgmLvANFsuUMXQadIzL8Ldn_vg',
    'activation vector: b64url(secret || HMAC(key, "/activate" || secret))'
);
SELECT is(
    mailroom.sign_token('password_recovery', '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f',
        '01234'),
    'AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh9i5OlN1SlaXoECDwHhTfKVusWAe9V0mmmeiRqSVmnb5A',
    'recovery vector: b64url(secret || HMAC(key, "/recover" || secret || code))'
);
SELECT is(
    mailroom_internal._b64url_decode('AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh_Ri3Yy9eHzSYzQ27mlxgmLvANFsuUMXQadIzL8Ldn_vg'),
    '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f'::bytea
    || hmac('/activate'::bytea || '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f'::bytea,
        (SELECT key FROM k), 'sha256'),
    'the signed value decodes to secret || mac'
);
SELECT is(
    mailroom_internal._signed_value('password_recovery', '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f',
        '01234', (SELECT key FROM k)),
    (mailroom_internal._signed_values(ARRAY['password_recovery'::mailroom.token_action],
        ARRAY['\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f'::bytea], ARRAY['01234'], (SELECT key FROM k)))[1],
    'the one-token form (claim) and the batch form (dequeue) sign alike'
);
SELECT throws_ok($$ SELECT mailroom.sign_token('activation', gen_random_bytes(31), NULL) $$,
    '22023', 'secret must be 32 bytes', 'sign_token: secret of the wrong length');
SELECT throws_ok($$ SELECT mailroom.sign_token('password_recovery', gen_random_bytes(32), '123') $$,
    '22023', 'a password-recovery code must be 5 digits', 'sign_token: recovery code not 5 digits');
SELECT throws_ok($$ SELECT mailroom.sign_token(NULL, gen_random_bytes(32), NULL) $$,
    '22004', 'sign_token: the action must not be NULL', 'sign_token: a NULL action is an error, not a NULL value');
SELECT throws_ok($$ SELECT mailroom.sign_token('activation', NULL, NULL) $$,
    '22004', 'sign_token: the secret must not be NULL', 'sign_token: a NULL secret is an error');
SELECT is(
    (SELECT pronargs FROM pg_proc WHERE oid = 'mailroom.sign_token'::regproc)::int, 3,
    'sign_token takes no key (one form: action, secret, code)'
);

-- a token has no secret, no code and no digest until it is dispatched; the dequeue mints them,
-- signs them with the active key and keeps only their digests
SELECT mailroom.create_account('vec@example.com', 'vec');
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'vec';
INSERT INTO mailroom.tokens (account, action, secret, code)
SELECT id, 'password_recovery', '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f', '01234'
FROM mailroom.accounts WHERE login = 'vec';
SELECT results_eq(
    $$ SELECT t.secret, t.code, t.secret_digest, t.code_digest FROM mailroom.tokens AS t
       JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'vec' AND t.action = 'password_recovery' $$,
    $$ VALUES (NULL::bytea, NULL::text, NULL::bytea, NULL::bytea) $$,
    'a pending token holds no secret, code or digest (a secret passed to the insert is dropped)'
);
CREATE TEMP TABLE d1 AS SELECT * FROM mailroom.dequeue_tokens(10);
CREATE TEMP TABLE d1_secret AS SELECT substr(mailroom_internal._b64url_decode(signed), 1, 32) AS secret FROM d1;
SELECT results_eq(
    $$ SELECT action::text, email, login, length(signed), code ~ '^[0-9]{5}$' FROM d1 $$,
    $$ VALUES ('password_recovery', 'vec@example.com', 'vec', 86, true) $$,
    'dequeue_tokens returns action, email, login, the signed value and a 5-digit code'
);
SELECT is(
    (SELECT signed FROM d1),
    mailroom.sign_token('password_recovery', (SELECT secret FROM d1_secret), (SELECT code FROM d1)),
    'the signed value is secret || HMAC(active key, "/recover" || secret || code), the layout of the C collector'
);
SELECT isnt((SELECT secret FROM d1_secret), '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f'::bytea,
    'the secret is minted at dispatch, not taken from the insert');
SELECT results_eq(
    $$ SELECT secret, code, dispatched_at FROM mailroom.tokens WHERE id = (SELECT token_id FROM d1) $$,
    $$ VALUES (NULL::bytea, NULL::text, '2000-01-01 00:00:00+00'::timestamptz) $$,
    'after dispatch the row holds no secret and no code'
);
SELECT results_eq(
    $$ SELECT secret_digest, code_digest FROM mailroom.tokens WHERE id = (SELECT token_id FROM d1) $$,
    $$ SELECT digest(s.secret, 'sha256'), digest(s.secret || convert_to((SELECT code FROM d1), 'UTF8'), 'sha256')
       FROM d1_secret AS s $$,
    'only secret_digest = sha256(secret) and code_digest = sha256(secret || code) are kept'
);
UPDATE mailroom.tokens SET secret = gen_random_bytes(32), code = '12345' WHERE id = (SELECT token_id FROM d1);
SELECT is((SELECT secret FROM mailroom.tokens WHERE id = (SELECT token_id FROM d1)), NULL,
    'a plaintext secret written back into a dispatched token is wiped');
SELECT throws_ok(
    $$ UPDATE mailroom.tokens AS t SET secret = gen_random_bytes(32)
       FROM mailroom.accounts AS a WHERE a.id = t.account AND a.login = 'vec' AND t.action = 'activation' $$,
    '23514', NULL, 'a plaintext secret cannot be written into a pending token either (CHECK tokens_no_plaintext)');
SELECT is((SELECT count(*)::int FROM mailroom.dequeue_tokens(10)), 0,
    'a dispatched token is not returned again');

-- a token email's delivery attempt mints again: the digest changes, the earlier link stops matching
CREATE TEMP TABLE m1 AS SELECT * FROM mailroom_internal._mint_token((SELECT token_id FROM d1));
SELECT isnt((SELECT signed FROM m1), (SELECT signed FROM d1), '_mint_token: a new link for the same token');
SELECT is(
    (SELECT secret_digest FROM mailroom.tokens WHERE id = (SELECT token_id FROM d1)),
    digest(substr(mailroom_internal._b64url_decode((SELECT signed FROM m1)), 1, 32), 'sha256'),
    '_mint_token: only the new secret''s digest is kept'
);
SET LOCAL mailroom.clock = '2000-01-01 01:00:00+00';
SELECT is(
    (SELECT expires_at FROM mailroom.tokens WHERE id = (SELECT token_id FROM d1)),
    '2000-01-01 00:15:00+00'::timestamptz, 'the token has expired by now'
);
SELECT is((SELECT count(*)::int FROM mailroom_internal._mint_token((SELECT token_id FROM d1))), 1, '_mint_token: a later attempt');
SELECT is(
    (SELECT expires_at FROM mailroom.tokens WHERE id = (SELECT token_id FROM d1)),
    '2000-01-01 01:15:00+00'::timestamptz, '_mint_token: an open token gets a fresh lifetime (tokens.ttl from now)'
);
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
SELECT is((SELECT count(*)::int FROM mailroom_internal._mint_token(-1)), 0, '_mint_token: no row for a token that is gone');

-- the keyed form of the previous release, kept one release, signs with the key it is given
SELECT mailroom.create_account('legacy@example.com', 'legacy');
SELECT is(
    (SELECT substr(mailroom_internal._b64url_decode(signed), 33, 32)
        = hmac('/activate'::bytea || substr(mailroom_internal._b64url_decode(signed), 1, 32), decode(repeat('ab', 32), 'hex'), 'sha256')
     FROM mailroom.dequeue_tokens(10, decode(repeat('ab', 32), 'hex'))),
    true, 'dequeue_tokens(limit, key) (deprecated) signs with the passed key'
);

-- revocation on reissue
SELECT mailroom.create_account('rev@example.com', 'rev');
CREATE TEMP TABLE rev_first AS
SELECT t.id FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'rev';
INSERT INTO mailroom.tokens (account, action) SELECT id, 'activation' FROM mailroom.accounts WHERE login = 'rev';
SELECT isnt((SELECT revoked_at FROM mailroom.tokens WHERE id = (SELECT id FROM rev_first)), NULL,
    'issuing a new activation token revokes the older one');
SELECT is((SELECT secret FROM mailroom.tokens WHERE id = (SELECT id FROM rev_first)), NULL,
    'the revoked token keeps no plaintext secret');
SELECT is(
    (SELECT count(*)::int FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.login = 'rev' AND t.revoked_at IS NULL), 1, 'exactly one open activation token after reissue');
SELECT is(
    (SELECT array_agg(token_id) FROM mailroom.dequeue_tokens(10)),
    (SELECT array_agg(t.id) FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.login = 'rev' AND t.revoked_at IS NULL),
    'only the new token is dequeued'
);

-- eligibility: one rule for the dequeue and for consume_token
SELECT results_eq(
    $$ SELECT a::text AS action, s::text AS status, mailroom_internal._token_eligible(a, s)
       FROM unnest(ARRAY['activation', 'password_recovery']::mailroom.token_action[]) AS a,
            unnest(enum_range(NULL::mailroom.account_status)) AS s
       ORDER BY a, s $$,
    $$ VALUES ('activation', 'provisioned', true), ('activation', 'active', false),
              ('activation', 'suspended', false), ('password_recovery', 'provisioned', false),
              ('password_recovery', 'active', true), ('password_recovery', 'suspended', false) $$,
    '_token_eligible: activation needs provisioned, recovery needs active'
);
SELECT ok(
    NOT mailroom_internal._token_eligible('activation', NULL) AND NOT mailroom_internal._token_eligible(NULL, 'active'),
    '_token_eligible is false (not NULL) for a missing status or action'
);
SELECT ok(
    mailroom_internal._dequeue_tokens_sql(true) ~ 'a\.status = ta\.eligible_status'
    AND pg_get_functiondef('mailroom_internal._token_eligible'::regproc) ~ 'a\.eligible_status = p_status'
    AND pg_get_functiondef('mailroom_internal._consume_token'::regproc) ~ '_token_eligible\(',
    'dequeue_tokens (joined) and consume_token (through _token_eligible) both decide eligibility by the type''s eligible_status'
);

-- eligibility: activation for provisioned, recovery for active, not expired, not consumed
SELECT mailroom.create_account('p1@example.com', 'p1');   -- provisioned: activation eligible
SELECT mailroom.create_account('p2@example.com', 'p2');
SELECT mailroom.suspend_account((SELECT id FROM mailroom.accounts WHERE login = 'p2'));  -- suspended: not eligible
SELECT mailroom.create_account('p3@example.com', 'p3');
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'p3';  -- active: activation not eligible
INSERT INTO mailroom.tokens (account, action)
SELECT id, 'password_recovery' FROM mailroom.accounts WHERE login = 'p1';  -- recovery for provisioned: no
INSERT INTO mailroom.tokens (account, action)
SELECT id, 'password_recovery' FROM mailroom.accounts WHERE login = 'p3';  -- recovery for active: yes
SELECT mailroom.create_account('p4@example.com', 'p4');
UPDATE mailroom.tokens SET consumed_at = mailroom.clock()
WHERE account = (SELECT id FROM mailroom.accounts WHERE login = 'p4');  -- consumed: no
SELECT results_eq(
    $$ SELECT login, action::text FROM mailroom.dequeue_tokens(100) ORDER BY token_id $$,
    $$ VALUES ('p1', 'activation'), ('p3', 'password_recovery') $$,
    'only eligible tokens are dequeued, in id order'
);
-- the suspended account's token comes back when the account is unsuspended (and reverts to provisioned)
SELECT mailroom.unsuspend_account((SELECT id FROM mailroom.accounts WHERE login = 'p2'));
SELECT results_eq(
    $$ SELECT login FROM mailroom.dequeue_tokens(100) $$,
    $$ VALUES ('p2') $$,
    'the pending activation token of an unsuspended never-activated account becomes eligible'
);

-- limit and ordering
INSERT INTO mailroom.accounts (email, login) SELECT 'bulk' || g || '@example.com', 'bulk' || g FROM generate_series(1, 25) AS g;
SELECT is((SELECT count(*)::int FROM mailroom.dequeue_tokens(10)), 10, 'limit 10 returns 10');
SELECT results_eq(
    $$ SELECT login FROM mailroom.dequeue_tokens(10) $$,
    $$ SELECT 'bulk' || g FROM generate_series(11, 20) AS g $$,
    'the next call returns the next 10 in id order'
);
SELECT is((SELECT count(*)::int FROM mailroom.dequeue_tokens(1000)), 5, 'then the last 5');
SELECT is((SELECT count(*)::int FROM mailroom.dequeue_tokens(1000)), 0, 'then nothing');

-- expiry with the pinned clock
SELECT mailroom.create_account('exp1@example.com', 'exp1');
SET LOCAL mailroom.clock = '2000-01-01 00:00:01+00';
SELECT mailroom.create_account('exp2@example.com', 'exp2');
SET LOCAL mailroom.clock = '2000-01-01 00:15:00+00';
SELECT results_eq(
    $$ SELECT login FROM mailroom.dequeue_tokens(10) $$,
    $$ VALUES ('exp2') $$,
    'at its expiry instant a token is not dequeued; one a second younger is'
);
SELECT results_eq(
    $$ SELECT t.revoked_at, t.secret, t.dispatched_at FROM mailroom.tokens AS t
       JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'exp1' $$,
    $$ VALUES ('2000-01-01 00:15:00+00'::timestamptz, NULL::bytea, NULL::timestamptz) $$,
    'the expired, never-dispatched token is closed by the dequeue (revoked_at = expires_at, secret wiped)'
);

-- TTL setting
SELECT mailroom.set_setting('tokens.ttl', '2 hours');
SELECT mailroom.create_account('ttl@example.com', 'ttl');
SELECT is(
    (SELECT t.expires_at - t.created_at FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.login = 'ttl'),
    '2 hours'::interval, 'tokens.ttl sets the lifetime'
);

-- a token is dequeued once made (created_at <= clock): a dequeue pinned before it never takes it (nor
-- locks it), so db verify's files, pinned before any installation existed, meet their own tokens alone
SET LOCAL mailroom.clock = '2000-01-02 00:00:00+00';
SELECT mailroom.create_account('made@example.com', 'made');
SET LOCAL mailroom.clock = '2000-01-01 12:00:00+00';
SELECT is((SELECT count(*)::int FROM mailroom.dequeue_tokens(1000) WHERE login = 'made'), 0,
    'a token is not dequeued before it was made');
SET LOCAL mailroom.clock = '2000-01-02 00:00:00+00';
SELECT is((SELECT count(*)::int FROM mailroom.dequeue_tokens(1000) WHERE login = 'made'), 1, 'and it is once made');

-- input errors
SELECT throws_ok($$ SELECT * FROM mailroom.dequeue_tokens(0, (SELECT key FROM k)) $$,
    '22023', 'dequeue_tokens: limit must be a positive integer, got 0', 'limit 0 refused');
SELECT throws_ok($$ SELECT * FROM mailroom.dequeue_tokens(NULL, (SELECT key FROM k)) $$,
    '22023', 'dequeue_tokens: limit must be a positive integer, got NULL', 'NULL limit refused');
SELECT throws_ok($$ SELECT * FROM mailroom.dequeue_tokens(10, NULL::bytea) $$,
    'MR120', 'signing key missing or shorter than 32 bytes', 'the deprecated keyed form: NULL key refused');
SELECT throws_ok($$ SELECT * FROM mailroom.dequeue_tokens(10, '\x0102'::bytea) $$,
    'MR120', 'signing key missing or shorter than 32 bytes', 'the deprecated keyed form: short key refused');
DELETE FROM mailroom.signing_keys WHERE state = 'active';
SELECT throws_ok($$ SELECT * FROM mailroom.dequeue_tokens(10) $$,
    'MR120', 'the keyring has no active signing key', 'no active key: the dequeue refuses (nothing is taken)');
SELECT mailroom.rotate_signing_key();

-- the due-query is served by the partial index on pending tokens
SELECT is(
    (SELECT indexdef FROM pg_indexes WHERE indexname = 'tokens_pending_idx'),
    'CREATE INDEX tokens_pending_idx ON ONLY mailroom.tokens USING btree (id) WHERE ((dispatched_at IS NULL) '
    || 'AND (consumed_at IS NULL) AND (revoked_at IS NULL) AND (expires_at > ''-infinity''::timestamp with time zone))',
    'partial index on pending tokens'
);
-- A batch's secrets and codes come from one draw of the CSPRNG (35 bytes a token): each token its
-- own secret and a 5-digit code, the row keeps the digests of exactly what was handed out, and the
-- signed value is the one-token signer's
SELECT count(mailroom.create_account('mint' || g || '@example.com', 'mint' || g)) FROM generate_series(1, 300) AS g;
CREATE TEMP TABLE minted_batch AS
SELECT d.action, d.login, d.signed, d.code, d.token_id,
    substring(mailroom_internal._b64url_decode(d.signed) FROM 1 FOR 32) AS secret
FROM mailroom.dequeue_tokens(1000) AS d
WHERE d.login LIKE 'mint%';
SELECT is(
    (SELECT ARRAY[count(*), count(DISTINCT secret), count(*) FILTER (WHERE octet_length(secret) = 32)]::int[] FROM minted_batch),
    ARRAY[300, 300, 300], 'a batch of 300: 300 tokens, 300 distinct 32-byte secrets'
);
SELECT ok(
    (SELECT bool_and(code ~ '^[0-9]{5}$') AND count(DISTINCT code) >= 290 FROM minted_batch),
    'every code 5 digits, and spread (at most 10 repeats in 300 draws of 10^5)'
);
SELECT is(
    (SELECT count(*)::int FROM minted_batch AS b
     INNER JOIN mailroom.tokens AS t ON t.id = b.token_id
     WHERE t.secret_digest = mailroom_internal._digest(b.secret, 'sha256')
         AND t.code_digest = mailroom_internal._digest(b.secret || convert_to(b.code, 'UTF8'), 'sha256')
         AND t.secret IS NULL AND t.code IS NULL),
    300, 'each row keeps pgcrypto''s SHA-256 of its secret and of secret || code, and no plaintext'
);
SELECT is(
    (SELECT count(*)::int FROM minted_batch AS b
     WHERE b.signed = mailroom_internal._signed_value(b.action, b.secret, b.code, mailroom_internal._active_signing_key())),
    300, 'each signed value is the one-token signer''s (same MAC, same base64url)'
);

-- NOTIFY trigger is per statement
SELECT is(
    (SELECT tgtype & 1 FROM pg_trigger WHERE tgname = 'after_tokens_inserted')::int, 0,
    'after_tokens_inserted is a statement-level trigger'
);
SELECT is(
    (SELECT count(*)::int FROM pg_trigger WHERE tgrelid = 'mailroom.tokens'::regclass AND NOT tgisinternal
     AND (tgtype & 1) = 1 AND (tgtype & 4) = 4 AND (tgtype & 2) = 0),
    0, 'no row-level AFTER INSERT trigger on tokens (no per-row NOTIFY)'
);
SELECT ok(mailroom.setting('tokens.channel') = 'token_insert', 'default channel token_insert');

-- The token types are rows of mailroom.token_actions (migration 0113), which every per-type rule reads.
SELECT results_eq(
    $$SELECT action::text, signing_path, eligible_status::text, with_code, activates_account, output_code
      FROM mailroom.token_actions() WHERE action IN ('activation', 'password_recovery')$$,
    $$VALUES ('activation', '/activate', 'provisioned', false, true, 1::smallint),
        ('password_recovery', '/recover', 'active', true, false, 2::smallint)$$,
    'token_actions(): each type''s signature path, eligible status, code, activation and CSV code'
);
SELECT is(
    (SELECT array_agg(e ORDER BY e) FROM unnest(enum_range(NULL::mailroom.token_action)) AS e
     WHERE NOT EXISTS (SELECT 1 FROM mailroom.token_actions AS a WHERE a.action = e)
         OR NOT EXISTS (SELECT 1 FROM mailroom.token_email_templates AS t WHERE t.action = e)),
    NULL, 'every value of the token_action type has its row and its email template'
);
-- a type that loses its row is refused everywhere, never given another type's rules: a link
-- dispatched before, and a token still pending
SET CONSTRAINTS ALL DEFERRED;
CREATE TEMP TABLE orphan AS
SELECT mailroom.create_account('orphan@example.com', 'orphan') AS id;
UPDATE mailroom.accounts SET status = 'active' WHERE id = (SELECT id FROM orphan);
INSERT INTO mailroom.tokens (account, action) SELECT id, 'password_recovery' FROM orphan;
CREATE TEMP TABLE orphan_signed AS
SELECT d.signed, d.code FROM mailroom.dequeue_tokens(1000) AS d
WHERE d.token_id IN (SELECT t.id FROM mailroom.tokens AS t WHERE t.account = (SELECT id FROM orphan));
CREATE TEMP TABLE orphan2 AS
SELECT mailroom.create_account('orphan2@example.com', 'orphan2') AS id;
UPDATE mailroom.accounts SET status = 'active' WHERE id = (SELECT id FROM orphan2);
INSERT INTO mailroom.tokens (account, action) SELECT id, 'password_recovery' FROM orphan2;
DELETE FROM mailroom.token_email_templates WHERE action = 'password_recovery';
DELETE FROM mailroom.token_actions WHERE action = 'password_recovery';
SELECT throws_ok(
    $$ SELECT mailroom.sign_token('password_recovery', gen_random_bytes(32), '12345') $$,
    'MR125', 'unknown token action password_recovery: no row in mailroom.token_actions',
    'signing a type without its row: MR125'
);
SELECT ok(NOT mailroom_internal._token_eligible('password_recovery', 'active'), 'a type without its row is eligible nowhere');
SELECT is(
    (SELECT count(*)::int FROM mailroom.dequeue_tokens(1000) AS d
     WHERE d.token_id IN (SELECT t.id FROM mailroom.tokens AS t WHERE t.account = (SELECT id FROM orphan2))),
    0, 'and its pending tokens are not dispatched'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.consume_token(%L, %L)', (SELECT signed FROM orphan_signed),
        (SELECT code FROM orphan_signed)),
    'MR125', NULL, 'nor consumed'
);
SELECT is(
    (SELECT v.valid FROM mailroom.verify_token((SELECT signed FROM orphan_signed), (SELECT code FROM orphan_signed)) AS v),
    false, 'nor verified as any other type'
);

-- an account's activation token is made at its account's instant: one reading of the clock, not two
-- (unpinned here, so two readings would differ; issue 46 item 3, the insert's trigger chain)
SET LOCAL mailroom.clock = '';
SELECT mailroom.create_account('one-instant@example.com', 'one-instant');
SELECT is(
    (SELECT t.created_at FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.email = 'one-instant@example.com'),
    (SELECT a.created_at FROM mailroom.accounts AS a WHERE a.email = 'one-instant@example.com'),
    'the activation token is created at its account''s instant'
);

SELECT * FROM finish();
ROLLBACK;
