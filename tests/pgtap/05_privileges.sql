-- Least privilege: every function pins its search_path, the API a runtime role calls runs as
-- the owner (SECURITY DEFINER), and each runtime role may execute exactly its part of the API.
BEGIN;
SELECT plan(7);

-- the functions of sql/00-14 (foundation, accounts and tokens)
CREATE TEMP TABLE accounts_area (fn regprocedure PRIMARY KEY, api boolean NOT NULL);
INSERT INTO accounts_area
SELECT p.oid::regprocedure, p.proname !~ '^(_|trg_)'
FROM pg_proc AS p
WHERE p.pronamespace = 'mailroom'::regnamespace
    AND p.proname IN (
        'clock', '_may_pin_clock', 'pin_clock', 'unpin_clock', 'setting', 'set_setting', '_check_setting_value',
        '_is_valid_address',
        '_random_bytes', '_digest', '_hmac', '_pgp_sym_encrypt', '_pgp_sym_decrypt',
        '_valid_email', '_check_account_identity', 'trg_before_account_insert',
        'trg_before_account_identity_change', 'trg_before_account_status_change', 'create_account',
        '_lock_account', 'suspend_account', 'unsuspend_account', '_random_code', '_b64url_encode',
        '_b64url_decode', '_check_key', '_token_mac', 'sign_token', 'trg_before_token_insert',
        'trg_before_token_close', 'trg_after_token_consumed', '_announce_tokens',
        'trg_after_tokens_inserted', 'trg_after_accounts_inserted', '_token_eligible',
        '_dequeue_tokens_sql', 'dequeue_tokens', '_ct_equal', '_mac_key_index', '_signing_keys',
        '_split_signed', 'verify_token', '_raise_token_state', 'consume_token',
        'request_password_recovery', 'purge_tokens'
    );

SELECT is(
    (
        SELECT coalesce(string_agg(a.fn::text, ', ' ORDER BY a.fn::text), '')
        FROM accounts_area AS a INNER JOIN pg_proc AS p ON a.fn = p.oid
        WHERE NOT coalesce('search_path=pg_catalog, pg_temp' = ANY(p.proconfig), false)
    ),
    '',
    'every accounts-area function pins search_path = pg_catalog, pg_temp'
);

SELECT is(
    (
        SELECT coalesce(string_agg(a.fn::text, ', ' ORDER BY a.fn::text), '')
        FROM accounts_area AS a INNER JOIN pg_proc AS p ON a.fn = p.oid
        WHERE p.prosrc ~ '(?<![._a-z])(gen_random_bytes|digest|hmac|pgp_sym_encrypt|pgp_sym_decrypt)\('
            AND p.proname NOT IN ('_random_bytes', '_digest', '_hmac', '_pgp_sym_encrypt', '_pgp_sym_decrypt')
    ),
    '',
    'pgcrypto is called only through the mailroom._* wrappers'
);

SELECT is(
    (
        SELECT coalesce(string_agg(a.fn::text, ', ' ORDER BY a.fn::text), '')
        FROM accounts_area AS a INNER JOIN pg_proc AS p ON a.fn = p.oid
        WHERE p.prosecdef <> a.api
    ),
    '',
    'the accounts API runs as its owner (SECURITY DEFINER); helpers and triggers run as the caller'
);

-- the application's part of the accounts API works with the application's rights alone
SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
SET LOCAL ROLE mailroom_app;
SELECT lives_ok(
    $$SELECT mailroom.create_account('priv@example.com', 'priv')$$,
    'mailroom_app creates an account (the definer function writes accounts and tokens)'
);
RESET ROLE;
SET LOCAL ROLE mailroom_collector;
SELECT is(
    (SELECT login FROM mailroom.dequeue_tokens(10, decode(repeat('ab', 32), 'hex'))),
    'priv',
    'mailroom_collector dequeues its activation token'
);
RESET ROLE;
SET LOCAL ROLE mailroom_app;
SELECT lives_ok(
    $$SELECT mailroom.suspend_account(mailroom.create_account('priv2@example.com', 'priv2'))$$,
    'mailroom_app suspends an account'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.dequeue_tokens(10, decode(repeat('ab', 32), 'hex'))$$,
    '42501', NULL,
    'mailroom_app may not dequeue tokens'
);
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
