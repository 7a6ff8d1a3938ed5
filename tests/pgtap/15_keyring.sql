-- The signing keyring: made by migrate, rotated, retired, exported and imported by the admin,
-- read by no runtime role.
BEGIN;
SELECT plan(32);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';

-- (an installation's keyring may hold older verify-only and retired keys: the test works on its active one)
SELECT results_eq(
    $$ SELECT state::text, octet_length(key) FROM mailroom.signing_keys WHERE state <> 'retired' ORDER BY state LIMIT 1 $$,
    $$ VALUES ('active', 32) $$,
    'migrate makes one active key of 32 random bytes'
);
SELECT ok(
    (SELECT origin FROM mailroom.signing_keys WHERE state = 'active') = 'generated'
    OR (SELECT count(*) FROM mailroom.signing_keys) > 1,
    'migrate generated it (on a used installation, a rotation or an import may have replaced it)'
);
CREATE TEMP TABLE k AS SELECT id AS first_id, key AS first_key, origin AS first_origin FROM mailroom.signing_keys WHERE state = 'active';

-- rotate
CREATE TEMP TABLE r AS SELECT mailroom.rotate_signing_key() AS id;
SELECT results_eq(
    $$ SELECT id, state::text, origin FROM mailroom.signing_keys WHERE id IN ((SELECT first_id FROM k), (SELECT id FROM r)) ORDER BY id $$,
    $$ VALUES ((SELECT first_id FROM k), 'verify_only', (SELECT first_origin FROM k)), ((SELECT id FROM r), 'active', 'generated') $$,
    'rotate: a new active key; the previous one becomes verify-only'
);
SELECT isnt((SELECT key FROM mailroom.signing_keys WHERE id = (SELECT id FROM r)), (SELECT first_key FROM k),
    'the new key is new bytes');
SELECT is((SELECT state_changed_at FROM mailroom.signing_keys WHERE id = (SELECT first_id FROM k)),
    '2030-01-01 00:00:00+00'::timestamptz, 'the change is dated by mailroom.clock()');
SELECT results_eq(
    $$ SELECT p_ids[1:2], cardinality(p_ids) FROM mailroom_internal._verifying_keys() $$,
    $$ VALUES (ARRAY[(SELECT id FROM r), (SELECT first_id FROM k)],
               (SELECT count(*)::int FROM mailroom.signing_keys WHERE state IN ('active', 'verify_only'))) $$,
    'verifiers try the active key, then the verify-only ones'
);

-- export
SELECT is(mailroom.export_signing_key(), (SELECT key FROM mailroom.signing_keys WHERE state = 'active'),
    'export without an id: the active key');
SELECT is(mailroom.export_signing_key((SELECT first_id FROM k)), (SELECT first_key FROM k),
    'export of a verify-only key by id');
SELECT isnt((SELECT last_exported_at FROM mailroom.signing_keys WHERE id = (SELECT first_id FROM k)), NULL,
    'an export is recorded (last_exported_at)');
SELECT throws_ok($$ SELECT mailroom.export_signing_key(-1) $$, 'MR121', 'no signing key -1', 'export: unknown id');

-- retire
SELECT throws_ok(format('SELECT mailroom.retire_signing_key(%s)', (SELECT id FROM r)),
    'MR122', format('signing key %s is the active key: rotate first (mailroom keys rotate)', (SELECT id FROM r)),
    'the active key cannot be retired');
SELECT throws_ok($$ SELECT mailroom.retire_signing_key(-1) $$, 'MR121', 'no signing key -1', 'retire: unknown id');
SELECT lives_ok(format('SELECT mailroom.retire_signing_key(%s)', (SELECT first_id FROM k)), 'retire a verify-only key');
SELECT results_eq(
    $$ SELECT state::text, key FROM mailroom.signing_keys WHERE id = (SELECT first_id FROM k) $$,
    $$ VALUES ('retired', NULL::bytea) $$,
    'a retired key is wiped'
);
SELECT lives_ok(format('SELECT mailroom.retire_signing_key(%s)', (SELECT first_id FROM k)), 'retiring twice is a no-op');
SELECT throws_ok(format('SELECT mailroom.export_signing_key(%s)', (SELECT first_id FROM k)),
    'MR123', NULL, 'a retired key cannot be exported');

-- import: the previous release's MAILROOM_SECRET_KEY, verify-only unless asked
CREATE TEMP TABLE i AS SELECT mailroom.import_signing_key(decode(repeat('cafebabe', 8), 'hex')) AS id;
SELECT results_eq(
    $$ SELECT state::text, origin FROM mailroom.signing_keys WHERE id = (SELECT id FROM i) $$,
    $$ VALUES ('verify_only', 'imported') $$,
    'import: the key is added verify-only'
);
SELECT is(mailroom.import_signing_key(decode(repeat('cafebabe', 8), 'hex')), (SELECT id FROM i),
    'importing the same key again finds it');
SELECT is(mailroom.import_signing_key(decode(repeat('cafebabe', 8), 'hex'), true), (SELECT id FROM i),
    'import --active of a known key');
SELECT results_eq(
    $$ SELECT id, state::text FROM mailroom.signing_keys WHERE id IN ((SELECT id FROM r), (SELECT id FROM i)) ORDER BY id $$,
    $$ VALUES ((SELECT id FROM r), 'verify_only'), ((SELECT id FROM i), 'active') $$,
    'it becomes the active key; the active one becomes verify-only'
);
SELECT throws_ok($$ SELECT mailroom.import_signing_key('\x0102') $$,
    'MR120', 'signing key missing or shorter than 32 bytes', 'import: a short key is refused');

-- list: no key bytes, a fingerprint to match an exported key
SELECT results_eq(
    $$ SELECT id, fingerprint FROM mailroom.list_signing_keys() WHERE id = (SELECT id FROM i) $$,
    $$ VALUES ((SELECT id FROM i), encode(substr(digest(decode(repeat('cafebabe', 8), 'hex'), 'sha256'), 1, 8), 'hex')) $$,
    'list_signing_keys: the first 8 bytes of sha256(key) as a fingerprint'
);
SELECT is(
    (SELECT fingerprint FROM mailroom.list_signing_keys() WHERE id = (SELECT first_id FROM k)), NULL,
    'and none for a retired key'
);

-- signing_key_state_of: a command holding MAILROOM_SECRET_KEY asks by fingerprint (the key never travels)
CREATE TEMP TABLE fp AS
SELECT
    encode(substr(sha256((SELECT key FROM mailroom.signing_keys WHERE state = 'active')), 1, 8), 'hex') AS active,
    encode(substr(sha256((SELECT key FROM mailroom.signing_keys WHERE state = 'verify_only' ORDER BY id LIMIT 1)), 1, 8), 'hex')
    AS verify_only;
GRANT SELECT ON fp TO mailroom_collector, mailroom_sender;
SELECT is(
    (SELECT fingerprint FROM mailroom.list_signing_keys() WHERE state = 'active'), (SELECT active FROM fp),
    'the fingerprint keys list shows is sha256(key), first 8 bytes, hex: what a command computes on its side'
);
SET LOCAL ROLE mailroom_collector;
SELECT is(mailroom.signing_key_state_of((SELECT active FROM fp))::text, 'active', 'the collector learns its key is active');
SELECT is(mailroom.signing_key_state_of((SELECT verify_only FROM fp))::text, 'verify_only', 'or verify-only');
SELECT is(mailroom.signing_key_state_of('0123456789abcdef'), NULL, 'or not in the keyring (NULL)');
SELECT throws_ok($$ SELECT mailroom.signing_key_state_of('0BADF00D') $$, '22023', NULL,
    'a fingerprint that is not 16 lowercase hex characters is refused');
SELECT throws_ok($$ SELECT * FROM mailroom.list_signing_keys() $$, '42501', NULL, 'and it cannot list the keyring');
RESET ROLE;
SET LOCAL ROLE mailroom_sender;
SELECT is(mailroom.signing_key_state_of((SELECT active FROM fp))::text, 'active', 'the sender may ask too');
RESET ROLE;

-- nobody but the owner reads or locks the table
SET LOCAL ROLE mailroom_app;
SELECT throws_ok($$ SELECT key FROM mailroom.signing_keys $$, '42501', NULL, 'a runtime role cannot read the keyring');
SELECT throws_ok($$ LOCK TABLE mailroom.signing_keys IN ACCESS SHARE MODE $$, '42501', NULL,
    'nor lock it (key changes serialize on a lock only mailroom can take)');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
