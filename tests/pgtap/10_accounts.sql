-- Accounts: validation, the insert and status triggers, create/suspend/unsuspend.
BEGIN;
SELECT plan(65);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';

-- schema
SELECT has_table('mailroom', 'accounts', 'accounts table exists');
SELECT has_table('mailroom', 'tokens', 'tokens table exists');
SELECT enum_has_labels('mailroom', 'account_status', ARRAY['provisioned', 'active', 'suspended'],
    'account_status labels');
SELECT set_eq(
    'SELECT unnest(enum_range(NULL::mailroom.token_action))::text',
    'SELECT action::text FROM mailroom.token_actions',
    'token_action labels: exactly the types of mailroom.token_actions (activation and password_recovery seeded)'
);
SELECT col_type_is('mailroom', 'accounts', 'created_at', 'timestamp with time zone', 'timestamps are timestamptz');
SELECT col_type_is('mailroom', 'tokens', 'expires_at', 'timestamp with time zone', 'expires_at is timestamptz');
SELECT has_trigger('mailroom', 'accounts', 'before_account_insert', 'trigger 1: before_account_insert');
SELECT has_trigger('mailroom', 'accounts', 'before_account_status_change', 'trigger 2: before_account_status_change');
SELECT has_trigger('mailroom', 'tokens', 'after_token_consumed', 'trigger 3: after_token_consumed');
SELECT has_trigger('mailroom', 'tokens', 'after_tokens_inserted', 'trigger 4: after_tokens_inserted');
SELECT ok(
    -- the parent's constraint (tokens is partitioned: each partition has a clone of that name)
    (SELECT condeferrable AND condeferred FROM pg_constraint
     WHERE conname = 'tokens_account_fkey' AND conrelid = 'mailroom.tokens'::regclass),
    'tokens -> accounts FK is DEFERRABLE INITIALLY DEFERRED'
);
SELECT is(
    (SELECT count(DISTINCT p.proname)::int || ' ' || count(*) FILTER (WHERE obj_description(p.oid, 'pg_proc') IS NULL)
     FROM pg_proc AS p
     JOIN pg_namespace AS n ON n.oid = p.pronamespace
     WHERE n.nspname = 'mailroom'
       AND p.proname IN ('create_account', 'request_password_recovery', 'dequeue_tokens', 'verify_token',
                         'consume_token', 'suspend_account', 'unsuspend_account', 'sign_token',
                         'rotate_signing_key', 'retire_signing_key', 'export_signing_key', 'import_signing_key',
                         'list_signing_keys')),
    '13 0', 'every public accounts/tokens function (each form of it) has a COMMENT'
);

-- create_account: insert trigger creates the activation token in the same transaction
SELECT lives_ok($$ SELECT mailroom.create_account('Alice@Example.com', 'alice') $$, 'create_account works');
CREATE TEMP TABLE alice AS SELECT * FROM mailroom.accounts WHERE login = 'alice';
SELECT is((SELECT status FROM alice), 'provisioned'::mailroom.account_status, 'new account is provisioned');
SELECT is((SELECT created_at FROM alice), '2030-01-01 00:00:00+00'::timestamptz, 'created_at from mailroom.clock()');
SELECT is(
    (SELECT count(*)::int FROM mailroom.tokens AS t, alice AS a WHERE t.account = a.id AND t.action = 'activation'),
    1, 'activation token inserted by the BEFORE INSERT trigger'
);
SELECT is(
    (SELECT t.expires_at FROM mailroom.tokens AS t, alice AS a WHERE t.account = a.id),
    '2030-01-01 00:15:00+00'::timestamptz, 'token expires after tokens.ttl (15 minutes)'
);

-- validation and uniqueness
SELECT throws_ok($$ SELECT mailroom.create_account('alice@example.COM', 'alice2') $$,
    'MR102', 'an account with this email address already exists', 'email unique case-insensitively');
SELECT throws_ok($$ SELECT mailroom.create_account('bob@example.com', 'alice') $$,
    'MR103', 'an account with this login already exists', 'login unique');
SELECT is(
    (SELECT count(*)::int FROM mailroom.tokens AS t
     WHERE NOT EXISTS (SELECT FROM mailroom.accounts AS a WHERE a.id = t.account)),
    0, 'a refused create_account leaves no token behind (its trigger''s token goes with the error)'
);
SELECT throws_ok($$ SELECT mailroom.create_account('not-an-email', 'x1') $$,
    'MR101', 'invalid email address', 'email without @ rejected');
SELECT throws_ok($$ SELECT mailroom.create_account('a b@example.com', 'x2') $$,
    'MR101', 'invalid email address', 'email with a space rejected');
SELECT throws_ok($$ SELECT mailroom.create_account(NULL, 'x3') $$,
    'MR101', 'invalid email address', 'NULL email rejected');
SELECT throws_ok($$ SELECT mailroom.create_account(repeat('a', 250) || '@x.io', 'x4') $$,
    'MR101', 'invalid email address', 'email over 254 characters rejected');
SELECT throws_ok($$ SELECT mailroom.create_account('x5@example.com', '') $$,
    'MR104', 'invalid login', 'empty login rejected');
SELECT throws_ok($$ SELECT mailroom.create_account('x6@example.com', ' padded ') $$,
    'MR104', 'invalid login', 'login with surrounding spaces rejected');
SELECT throws_ok($$ INSERT INTO mailroom.accounts (email, login) VALUES ('bad', 'y1') $$,
    'MR101', 'invalid email address', 'plain INSERT is validated too');
SELECT throws_ok($$ UPDATE mailroom.accounts SET email = 'bad' WHERE login = 'alice' $$,
    'MR101', 'invalid email address', 'UPDATE of email is validated');

-- status trigger through plain UPDATEs (as from psql)
SET LOCAL mailroom.clock = '2030-01-01 01:00:00+00';
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'alice';
SELECT is(
    (SELECT activated_at FROM mailroom.accounts WHERE login = 'alice'),
    '2030-01-01 01:00:00+00'::timestamptz, 'activation sets activated_at'
);
SELECT is(
    (SELECT status_changed_at FROM mailroom.accounts WHERE login = 'alice'),
    '2030-01-01 01:00:00+00'::timestamptz, 'status change sets status_changed_at'
);
SET LOCAL mailroom.clock = '2030-01-01 02:00:00+00';
UPDATE mailroom.accounts SET status = 'suspended' WHERE login = 'alice';
SELECT results_eq(
    $$ SELECT status::text, suspended_at, unsuspended_at FROM mailroom.accounts WHERE login = 'alice' $$,
    $$ VALUES ('suspended', '2030-01-01 02:00:00+00'::timestamptz, NULL::timestamptz) $$,
    'suspend sets suspended_at, clears unsuspended_at'
);
SET LOCAL mailroom.clock = '2030-01-01 03:00:00+00';
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'alice';
SELECT results_eq(
    $$ SELECT status::text, suspended_at, unsuspended_at, activated_at FROM mailroom.accounts WHERE login = 'alice' $$,
    $$ VALUES ('active', NULL::timestamptz, '2030-01-01 03:00:00+00'::timestamptz,
               '2030-01-01 01:00:00+00'::timestamptz) $$,
    'unsuspend of an activated account: active, unsuspended_at set, suspended_at cleared, activated_at kept'
);
SET LOCAL mailroom.clock = '2030-01-01 04:00:00+00';
UPDATE mailroom.accounts SET status = 'suspended' WHERE login = 'alice';
SELECT is(
    (SELECT unsuspended_at FROM mailroom.accounts WHERE login = 'alice'), NULL,
    'suspending again clears unsuspended_at'
);
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'alice';
SELECT throws_ok($$ UPDATE mailroom.accounts SET status = 'provisioned' WHERE login = 'alice' $$,
    'MR108', NULL, 'active -> provisioned refused');
UPDATE mailroom.accounts SET login = 'alice' WHERE login = 'alice';
SELECT is(
    (SELECT status_changed_at FROM mailroom.accounts WHERE login = 'alice'),
    '2030-01-01 04:00:00+00'::timestamptz, 'an UPDATE that does not change status leaves the timestamps'
);

-- revert to provisioned: suspended before ever being activated
SELECT mailroom.create_account('carol@example.com', 'carol');
SELECT is(mailroom.suspend_account((SELECT id FROM mailroom.accounts WHERE login = 'carol')),
    'suspended'::mailroom.account_status, 'suspend_account returns suspended');
SELECT is(mailroom.unsuspend_account((SELECT id FROM mailroom.accounts WHERE login = 'carol')),
    'provisioned'::mailroom.account_status, 'unsuspend_account reverts a never-activated account to provisioned');
SELECT results_eq(
    $$ SELECT activated_at, suspended_at, unsuspended_at FROM mailroom.accounts WHERE login = 'carol' $$,
    $$ VALUES (NULL::timestamptz, NULL::timestamptz, '2030-01-01 04:00:00+00'::timestamptz) $$,
    'reverted account: never activated, suspended_at cleared, unsuspended_at set'
);
UPDATE mailroom.accounts SET status = 'suspended' WHERE login = 'carol';
UPDATE mailroom.accounts SET status = 'active' WHERE login = 'carol';
SELECT is((SELECT status FROM mailroom.accounts WHERE login = 'carol'), 'provisioned'::mailroom.account_status,
    'plain UPDATE status=active on a suspended never-activated account also reverts to provisioned');
UPDATE mailroom.accounts SET status = 'suspended' WHERE login = 'carol';
UPDATE mailroom.accounts SET status = 'provisioned' WHERE login = 'carol';
SELECT is((SELECT status FROM mailroom.accounts WHERE login = 'carol'), 'provisioned'::mailroom.account_status,
    'suspended -> provisioned is an unsuspend for a never-activated account');
UPDATE mailroom.accounts SET status = 'suspended' WHERE login = 'alice';
SELECT throws_ok($$ UPDATE mailroom.accounts SET status = 'provisioned' WHERE login = 'alice' $$,
    'MR108', NULL, 'suspended -> provisioned refused for an activated account');
SELECT is(mailroom.unsuspend_account((SELECT id FROM mailroom.accounts WHERE login = 'alice')),
    'active'::mailroom.account_status, 'unsuspend_account returns active for an activated account');

-- suspend/unsuspend errors
SELECT throws_ok($$ SELECT mailroom.suspend_account(-1) $$, 'MR105', 'unknown account -1', 'suspend unknown');
SELECT throws_ok($$ SELECT mailroom.unsuspend_account(-1) $$, 'MR105', 'unknown account -1', 'unsuspend unknown');
SELECT throws_ok($$ SELECT mailroom.suspend_account(NULL) $$, 'MR105', 'unknown account NULL', 'suspend NULL');
SELECT mailroom.suspend_account((SELECT id FROM mailroom.accounts WHERE login = 'carol'));
SELECT throws_ok(
    format('SELECT mailroom.suspend_account(%s)', (SELECT id FROM mailroom.accounts WHERE login = 'carol')),
    'MR106', NULL, 'suspending a suspended account');
SELECT throws_ok(
    format('SELECT mailroom.unsuspend_account(%s)', (SELECT id FROM mailroom.accounts WHERE login = 'alice')),
    'MR107', NULL, 'unsuspending an account that is not suspended');

-- an account inserted directly as active gets no activation token, a consistent activated_at
INSERT INTO mailroom.accounts (email, login, status) VALUES ('dave@example.com', 'dave', 'active');
SELECT is(
    (SELECT count(*)::int FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account
     WHERE a.login = 'dave'), 0, 'no activation token for an account inserted active');
SELECT is((SELECT activated_at FROM mailroom.accounts WHERE login = 'dave'),
    '2030-01-01 04:00:00+00'::timestamptz, 'account inserted active has activated_at');

-- consuming the activation token, even by a plain UPDATE, activates a provisioned account
SELECT mailroom.create_account('erin@example.com', 'erin');
UPDATE mailroom.tokens SET consumed_at = mailroom.clock()
WHERE account = (SELECT id FROM mailroom.accounts WHERE login = 'erin') AND action = 'activation';
SELECT is((SELECT status FROM mailroom.accounts WHERE login = 'erin'), 'active'::mailroom.account_status,
    'trigger 3: consuming the activation token activates a provisioned account');
SELECT is(
    (SELECT secret FROM mailroom.tokens WHERE account = (SELECT id FROM mailroom.accounts WHERE login = 'erin')),
    NULL, 'a consumed token keeps no plaintext secret');
-- ... but not a suspended one
SELECT mailroom.create_account('fay@example.com', 'fay');
SELECT mailroom.suspend_account((SELECT id FROM mailroom.accounts WHERE login = 'fay'));
UPDATE mailroom.tokens SET consumed_at = mailroom.clock()
WHERE account = (SELECT id FROM mailroom.accounts WHERE login = 'fay');
SELECT is((SELECT status FROM mailroom.accounts WHERE login = 'fay'), 'suspended'::mailroom.account_status,
    'consuming the activation token of a suspended account does not activate it');

-- deferred FK: a token for an account that never appears fails at commit
SELECT throws_ok(
    $$ INSERT INTO mailroom.tokens (account, action) VALUES (-42, 'activation'); SET CONSTRAINTS ALL IMMEDIATE $$,
    '23503', NULL, 'deferred FK still enforced at commit');

-- account_status: how an application reads an account's status
CREATE TEMP TABLE dora AS SELECT mailroom.create_account('dora@example.com', 'dora') AS id;
SELECT is(mailroom.account_status((SELECT id FROM dora)), 'provisioned'::mailroom.account_status,
    'account_status: a new account is provisioned');
SELECT mailroom.suspend_account((SELECT id FROM dora));
SELECT is(mailroom.account_status((SELECT id FROM dora)), 'suspended'::mailroom.account_status,
    'account_status follows a suspension');
SELECT throws_ok($$ SELECT mailroom.account_status(-1) $$, 'MR105', 'unknown account -1',
    'account_status of an unknown account: MR105');

-- the time of a status change: what the statement stamped in status_changed_at (the API does: on
-- Citus the trigger runs on a worker, whose clock is not the caller's), else mailroom.clock()
CREATE TEMP TABLE gus AS SELECT mailroom.create_account('gus@example.com', 'gus') AS id;
UPDATE mailroom.accounts SET status = 'suspended', status_changed_at = '2031-05-05 05:05:05+00'
WHERE id = (SELECT id FROM gus);
SELECT is(
    (SELECT (suspended_at, status_changed_at)::text FROM mailroom.accounts WHERE id = (SELECT id FROM gus)),
    '("2031-05-05 05:05:05+00","2031-05-05 05:05:05+00")',
    'a status change stamped by its statement keeps that time (suspended_at follows it)');
SELECT set_config('mailroom.clock', '2031-06-06 06:06:06+00', true);
UPDATE mailroom.accounts SET status = 'active' WHERE id = (SELECT id FROM gus);
SELECT is(
    (SELECT (unsuspended_at, status_changed_at)::text FROM mailroom.accounts WHERE id = (SELECT id FROM gus)),
    '("2031-06-06 06:06:06+00","2031-06-06 06:06:06+00")',
    'a status change its statement did not stamp takes mailroom.clock()');

-- list_accounts: `mailroom account list / show` (admin)
CREATE TEMP TABLE la AS
SELECT mailroom.create_account('List.One@example.com', 'list_one') AS a1,
       mailroom.create_account('list.two@example.com', 'list_two') AS a2;
SELECT results_eq(
    $$ SELECT login, status::text FROM mailroom.list_accounts(p_email => 'list.one@EXAMPLE.com') $$,
    $$ VALUES ('list_one', 'provisioned') $$,
    'one account by its address, any case'
);
SELECT results_eq(
    $$ SELECT login FROM mailroom.list_accounts(p_account => (SELECT a2 FROM la)) $$,
    $$ VALUES ('list_two') $$,
    'one account by id'
);
SELECT results_eq(
    $$ SELECT login FROM mailroom.list_accounts(p_after => (SELECT a1 FROM la), p_limit => 1) $$,
    $$ VALUES ('list_two') $$,
    'a page after the last id seen, in id order'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.list_accounts(p_status => 'suspended', p_after => (SELECT a1 FROM la) - 1)), 0,
    'filtered by status'
);
SELECT throws_ok($$ SELECT * FROM mailroom.list_accounts(p_limit => 0) $$, '22023', NULL, 'a limit out of range is refused');
SET LOCAL ROLE mailroom_app;
SELECT throws_ok($$ SELECT * FROM mailroom.list_accounts() $$, '42501', NULL,
    'the application cannot list accounts (addresses are PII: admin only)');
RESET ROLE;

-- the Citus seam of the token triggers (mailroom.db.citus.SEAMS): on one node they cascade
SELECT ok(mailroom_internal._triggers_cascade(), 'one node: row triggers write other tables (the activation token, a reissue''s revocation)');

SELECT * FROM finish();
ROLLBACK;
