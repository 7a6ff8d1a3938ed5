-- Caller-supplied patterns (sql/09_patterns.sql): refused before they run, with MR010/MR011, in
-- every function that takes one.
BEGIN;
SELECT plan(21);
\ir fixtures/default_settings.sql

SELECT is(mailroom_internal._caller_pattern('\m\d{5}\M', 'regex'), '\m\d{5}\M', 'the default code pattern passes');
SELECT is(mailroom_internal._caller_pattern('code: ([A-Z0-9]{6,8})', 'regex'), 'code: ([A-Z0-9]{6,8})', 'a group with a bounded count passes');
SELECT is(mailroom_internal._caller_pattern(null, 'regex'), null, 'NULL passes (the caller''s default)');
SELECT throws_ok($$SELECT mailroom_internal._caller_pattern('(.*)(.*)(.*)\3\2\1$', 'regex')$$, 'MR010', NULL,
                 'the reproduction of issue 34 (back-references) is refused');
SELECT throws_ok($$SELECT mailroom_internal._caller_pattern('(a)\1', 'regex')$$, 'MR010', NULL, 'a single back-reference is refused');
SELECT throws_ok($$SELECT mailroom_internal._caller_pattern('[\1]x', 'regex')$$, 'MR034', NULL,
                 'inside a bracket expression a digit escape is no back-reference (not MR010): it does not compile (MR034)');
SELECT throws_ok($$SELECT mailroom_internal._caller_pattern(repeat('a', 201), 'regex')$$, 'MR010', NULL, 'over 200 characters');
SELECT throws_ok($$SELECT mailroom_internal._caller_pattern('a*b*c*d*e*f*g*h*i*', 'regex')$$, 'MR010', NULL, 'nine quantifiers');
SELECT lives_ok($$SELECT mailroom_internal._caller_pattern('a*?b+?c??d*e*f*g*h*', 'regex')$$, 'a lazy quantifier counts once: eight pass');
SELECT throws_ok($$SELECT mailroom_internal._caller_pattern('a{1,1000}', 'regex')$$, 'MR010', NULL, 'a repetition count over 100');
SELECT throws_ok($$SELECT mailroom_internal._caller_pattern('a{101}', 'regex')$$, 'MR010', NULL, 'an exact count over 100');
SELECT lives_ok($$SELECT mailroom_internal._caller_pattern('(?:ab)+[*+?]{2}', 'regex')$$, 'a non-capturing group and literal quantifier characters in brackets');
SELECT is(mailroom_internal._caller_pattern('%/activate%', 'like'), '%/activate%', 'a LIKE pattern passes');
SELECT throws_ok($$SELECT mailroom_internal._caller_pattern('%a%b%c%d%e%f%g%h%i%', 'like')$$, 'MR011', NULL, 'nine % wildcards');
SELECT throws_ok($$SELECT mailroom_internal._caller_pattern(repeat('_', 201), 'like')$$, 'MR011', NULL, 'a LIKE pattern over 200 characters');
SELECT throws_ok($$SELECT mailroom_internal._caller_pattern('x', 'glob')$$, '22023', NULL, 'an unknown kind');

-- every public function that takes a pattern checks it first
SELECT throws_ok($$SELECT mailroom.extract_code('nobody@example.test', 'x', 1, '(.*)\1')$$, 'MR010', NULL,
                 'extract_code checks its pattern before anything else');
SELECT throws_ok($$SELECT mailroom.extract_link('nobody@example.test', 'x', 1, repeat('%', 9))$$, 'MR011', NULL,
                 'extract_link checks its LIKE pattern');
SELECT throws_ok($$SELECT mailroom.find_message('nobody@example.test', 'x', repeat('%', 9))$$, 'MR011', NULL,
                 'find_message checks its subject pattern');
SELECT throws_ok($$SELECT * FROM mailroom.wait_for_message('nobody@example.test', 'x', '1 second', repeat('%', 9))$$,
                 'MR011', NULL, 'wait_for_message checks its subject pattern');

SELECT throws_ok(
    $$SELECT mailroom_internal._caller_pattern('([0-9]+', 'regex')$$, 'MR034', null,
    'a regex within its bounds that does not compile: MR034, not the compiler''s 2201B'
);

SELECT * FROM finish();
ROLLBACK;
