-- API keys: registered by digest only, listed without it, revoked at once; _api_key_owner decides.
BEGIN;
SELECT plan(9);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE k AS SELECT mailroom.create_api_key('team-1', sha256('mrk_one'::bytea), 'ci', '_one') AS id;
SELECT is(mailroom_internal._api_key_owner(sha256('mrk_one'::bytea)), 'team-1', 'a live key names its owner');
SELECT is(mailroom_internal._api_key_owner(null), null, 'no key: NULL');
SELECT throws_ok($$SELECT mailroom_internal._api_key_owner(sha256('mrk_two'::bytea))$$, 'MR241', NULL, 'an unknown key: MR241');
SELECT is(
    (SELECT row(owner_id, label, hint, revoked_at)::text FROM mailroom.list_api_keys('team-1')),
    '(team-1,ci,_one,)', 'listed with label and hint, never the digest'
);
SELECT ok(mailroom.revoke_api_key((SELECT id FROM k)), 'revoke');
SELECT ok(NOT mailroom.revoke_api_key((SELECT id FROM k)), 'revoking twice: false');
SELECT throws_ok($$SELECT mailroom_internal._api_key_owner(sha256('mrk_one'::bytea))$$, 'MR241', NULL, 'a revoked key: MR241');
SELECT throws_ok($$SELECT mailroom.create_api_key('x', '\x00'::bytea)$$, 'MR247', NULL, 'a digest not of 32 bytes: MR247');
SELECT throws_ok($$SELECT mailroom.revoke_api_key(-1)$$, 'MR248', NULL, 'no such key: MR248');

SELECT * FROM finish();
ROLLBACK;
