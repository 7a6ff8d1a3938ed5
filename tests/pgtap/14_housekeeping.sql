-- purge_tokens: deletes only tokens that expired long enough ago.
BEGIN;
SELECT plan(5);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: the installation's own tokens are younger than the
-- test's, so the purge counts and deletes the test's alone
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
SELECT mailroom.create_account('old@example.com', 'old');
SET LOCAL mailroom.clock = '2000-01-05 00:00:00+00';
SELECT mailroom.create_account('new@example.com', 'new');
SET LOCAL mailroom.clock = '2000-01-09 00:00:00+00';

SELECT is(mailroom.purge_tokens(), 1::bigint, 'the token that expired 8 days ago is purged');
SELECT results_eq(
    $$ SELECT a.login FROM mailroom.tokens AS t JOIN mailroom.accounts AS a ON a.id = t.account WHERE a.login IN ('old', 'new') $$,
    $$ VALUES ('new') $$, 'the 4-day-old token is kept by the 7-day default');
SELECT is(mailroom.purge_tokens('2 days'), 1::bigint, 'a shorter retention purges it too');
SELECT throws_ok($$ SELECT mailroom.purge_tokens('1 hour') $$, '22023', NULL, 'less than 1 day is refused');
SELECT throws_ok($$ SELECT mailroom.purge_tokens(NULL) $$, '22023', NULL, 'NULL is refused');

SELECT * FROM finish();
ROLLBACK;
