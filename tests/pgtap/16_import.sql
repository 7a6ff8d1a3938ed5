-- Moving from the original mailroom (sql/16_import.sql): one batch of the seed's accounts and tokens,
-- epoch integers, the jobs.last_seq cursor; collisions skipped and counted; twice imports nothing.
BEGIN;
SELECT plan(16);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: the dequeue meets the test's tokens alone
-- (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';  -- epoch 946684800
SELECT mailroom.create_account('taken@example.com', 'someone');
SELECT mailroom.create_account('other@example.com', 'takenlogin');

CREATE TEMP TABLE seed_accounts AS
SELECT jsonb_build_array(
    jsonb_build_object('id', 1, 'email', 'prov@example.com', 'login', 'prov', 'status', 'provisioned',
        'created_at', 946684700),
    jsonb_build_object('id', 2, 'email', 'act@example.com', 'login', 'act', 'status', 'active',
        'created_at', 946228800, 'status_changed_at', 946228900, 'activated_at', 946228900),
    jsonb_build_object('id', 3, 'email', 'sus@example.com', 'login', 'sus', 'status', 'suspended',
        'created_at', 946228800, 'status_changed_at', 946229000, 'activated_at', 946228900,
        'suspended_at', 946229000),
    jsonb_build_object('id', 4, 'email', 'new@example.com', 'login', 'new', 'status', 'provisioned',
        'created_at', 946684600),
    jsonb_build_object('id', 5, 'email', 'stale@example.com', 'login', 'stale', 'status', 'provisioned',
        'created_at', 853228800),
    jsonb_build_object('id', 6, 'email', 'Taken@Example.com', 'login', 'taken2', 'status', 'active',
        'created_at', 946228800),
    jsonb_build_object('id', 7, 'email', 'clash@example.com', 'login', 'takenlogin', 'status', 'active',
        'created_at', 946228800),
    jsonb_build_object('id', 8, 'email', 'nodot@localhost', 'login', 'nodot', 'status', 'active',
        'created_at', 946228800)
) AS a;

-- secrets: 32 bytes of 'a' (token 1, dispatched) and of 'b' (token 2, dispatched recovery)
CREATE TEMP TABLE s AS SELECT
    decode(repeat('61', 32), 'hex') AS s1, '12345'::text AS c1,
    decode(repeat('62', 32), 'hex') AS s2, '54321'::text AS c2;

CREATE TEMP TABLE seed_tokens AS
SELECT jsonb_build_array(
    jsonb_build_object('id', 1, 'action', 'activation', 'account', 1, 'created_at', 946684700,
        'expires_at', 946685600,
        'secret_digest', encode(mailroom_internal._digest(s.s1, 'sha256'), 'hex'),
        'code_digest', encode(mailroom_internal._digest(s.s1 || convert_to(s.c1, 'UTF8'), 'sha256'), 'hex')),
    jsonb_build_object('id', 2, 'action', 'password_recovery', 'account', 2, 'created_at', 946684700,
        'expires_at', 946685600,
        'secret_digest', encode(mailroom_internal._digest(s.s2, 'sha256'), 'hex'),
        'code_digest', encode(mailroom_internal._digest(s.s2 || convert_to(s.c2, 'UTF8'), 'sha256'), 'hex')),
    jsonb_build_object('id', 3, 'action', 'activation', 'account', 2, 'created_at', 946228800,
        'expires_at', 946229700, 'consumed_at', 946228900, 'secret_digest', repeat('00', 32)),
    jsonb_build_object('id', 4, 'action', 'activation', 'account', 4, 'created_at', 946684600,
        'expires_at', 946685500, 'secret_digest', repeat('01', 32)),
    jsonb_build_object('id', 5, 'action', 'activation', 'account', 5, 'created_at', 853228800,
        'expires_at', 853229700, 'secret_digest', repeat('02', 32)),
    jsonb_build_object('id', 6, 'action', 'activation', 'account', 6, 'created_at', 946684700,
        'expires_at', 946685600, 'secret_digest', repeat('03', 32)),
    jsonb_build_object('id', 9, 'action', 'activation', 'account', 4, 'created_at', 946684650,
        'expires_at', 946685550, 'secret_digest', repeat('04', 32))
) AS t
FROM s;

CREATE TEMP TABLE first_run AS
SELECT * FROM mailroom.import_seed_accounts((SELECT a FROM seed_accounts), (SELECT t FROM seed_tokens), 2);

SELECT results_eq(
    $$ SELECT item, affected FROM first_run $$,
    $$ VALUES ('accounts imported', 5::bigint), ('accounts skipped: already imported', 0),
        ('accounts skipped: email exists', 1), ('accounts skipped: login exists', 1),
        ('accounts skipped: invalid email or login', 1),
        ('activation tokens issued (provisioned, none usable in the seed)', 1),
        ('tokens imported dispatched', 2), ('tokens imported undispatched', 1),
        ('tokens left: consumed', 1), ('tokens left: expired', 1),
        ('tokens left: superseded by a newer one', 1), ('tokens left: their account skipped', 1) $$,
    'first run: five accounts imported, collisions and the invalid address skipped, tokens sorted'
);

SELECT results_eq(
    $$ SELECT login, status::text, created_at, status_changed_at, activated_at, suspended_at, unsuspended_at
       FROM mailroom.accounts WHERE login IN ('prov', 'act', 'sus', 'new', 'stale') ORDER BY id $$,
    $$ VALUES
        ('prov', 'provisioned', to_timestamp(946684700), NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz),
        ('act', 'active', to_timestamp(946228800), to_timestamp(946228900), to_timestamp(946228900), NULL, NULL),
        ('sus', 'suspended', to_timestamp(946228800), to_timestamp(946229000), to_timestamp(946228900),
            to_timestamp(946229000), NULL),
        ('new', 'provisioned', to_timestamp(946684600), NULL, NULL, NULL, NULL),
        ('stale', 'provisioned', to_timestamp(853228800), NULL, NULL, NULL, NULL) $$,
    'statuses come over; epoch integers become timestamptz'
);

SELECT is(
    (SELECT count(*) FROM mailroom.accounts WHERE email IN ('Taken@Example.com', 'clash@example.com', 'nodot@localhost')),
    0::bigint, 'a colliding email (case-insensitively), a colliding login, an invalid address: not imported'
);

SELECT results_eq(
    $$ SELECT t.action::text, t.created_at, t.expires_at, t.dispatched_at IS NOT NULL,
              t.secret_digest = mailroom_internal._digest((SELECT s1 FROM s), 'sha256')
       FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'prov' $$,
    $$ VALUES ('activation', to_timestamp(946684700), to_timestamp(946685600), TRUE, TRUE) $$,
    'a provisioned account with a usable activation token keeps only it: dispatched (id <= last_seq), its digest'
);

SELECT results_eq(
    $$ SELECT t.dispatched_at IS NULL, t.secret_digest IS NULL, t.created_at
       FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'new' $$,
    $$ VALUES (TRUE, TRUE, to_timestamp(946684650)) $$,
    'undispatched (id > last_seq): the newest usable one only, no digest (mailroom mints at dispatch)'
);

SELECT results_eq(
    $$ SELECT t.action::text, t.dispatched_at IS NULL, t.created_at
       FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login = 'stale' $$,
    $$ VALUES ('activation', TRUE, '2000-01-01 00:00:00+00'::timestamptz) $$,
    'a provisioned account whose seed tokens expired gets mailroom''s fresh activation token'
);

SELECT is(
    (SELECT count(*) FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.login IN ('act', 'sus')),
    1::bigint, 'consumed tokens stay behind: the active account brings its usable recovery token only'
);

-- the seed's user follows the link the seed's collector mailed
SELECT results_eq(
    $$ SELECT c.outcome FROM mailroom.consume_token(
        mailroom_internal._signed_value('activation', (SELECT s1 FROM s), NULL, mailroom_internal._active_signing_key())) AS c $$,
    $$ VALUES ('consumed') $$,
    'a dispatched token''s link (signed by the keyring''s key) consumes'
);
SELECT is((SELECT status::text FROM mailroom.accounts WHERE login = 'prov'), 'active',
    'and activates the imported account');
SELECT results_eq(
    $$ SELECT c.outcome FROM mailroom.consume_token(
        mailroom_internal._signed_value('password_recovery', (SELECT s2 FROM s), (SELECT c2 FROM s),
            mailroom_internal._active_signing_key()), (SELECT c2 FROM s)) AS c $$,
    $$ VALUES ('consumed') $$,
    'a dispatched recovery token consumes with the code the seed mailed'
);

SELECT results_eq(
    $$ SELECT d.login FROM mailroom.dequeue_tokens(10) AS d WHERE d.login NOT IN ('someone', 'takenlogin')
       ORDER BY d.login $$,
    $$ VALUES ('new'), ('stale') $$,
    'the collector dispatches the undispatched tokens, never the ones the seed mailed'
);

CREATE TEMP TABLE second_run AS
SELECT * FROM mailroom.import_seed_accounts((SELECT a FROM seed_accounts), (SELECT t FROM seed_tokens), 2);
SELECT results_eq(
    $$ SELECT item, affected FROM second_run WHERE affected > 0 $$,
    $$ VALUES ('accounts skipped: already imported', 5::bigint), ('accounts skipped: email exists', 1),
        ('accounts skipped: login exists', 1), ('accounts skipped: invalid email or login', 1),
        ('tokens left: their account skipped', 7) $$,
    'a second run imports nothing'
);

SELECT throws_ok(
    $$ SELECT * FROM mailroom.import_seed_accounts('{}', '[]', 0) $$,
    'MR130', NULL, 'accounts not an array: MR130'
);
SELECT throws_ok(
    $$ SELECT * FROM mailroom.import_seed_accounts(
        '[{"id": 1, "email": "x@example.com", "login": "x", "status": "deleted", "created_at": 1}]', '[]', 0) $$,
    'MR130', NULL, 'an unknown status: MR130'
);
SELECT throws_ok(
    $$ SELECT * FROM mailroom.import_seed_accounts('[]',
        '[{"id": 1, "action": "activation", "account": 1, "created_at": 1, "expires_at": 2}]', 5) $$,
    'MR130', NULL, 'a dispatched token without its digest: MR130'
);

SELECT is(
    has_function_privilege('mailroom_app', 'mailroom.import_seed_accounts(jsonb, jsonb, bigint)', 'EXECUTE'),
    FALSE, 'the import is the admin''s only'
);

SELECT * FROM finish();
ROLLBACK;
