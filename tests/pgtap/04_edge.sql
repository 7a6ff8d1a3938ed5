-- sql/04_edge.sql: the edge's refusals, each raised with its code and message; each code's row gives
-- the HTTP status the faces answer; the HTTP role may ask.
BEGIN;
SELECT plan(8);

SELECT throws_ok(
    $$SELECT mailroom.edge_refusal('body_too_large', 16384)$$, 'MR030',
    'the request body is over 16384 bytes, this route''s bound', 'a body over its bound: MR030 names the bound'
);
SELECT throws_ok(
    $$SELECT mailroom.edge_refusal('nul')$$, 'MR031',
    'the request holds a NUL character (%00, or \u0000 in a JSON string), which no text may hold', 'a NUL: MR031'
);
SELECT throws_ok($$SELECT mailroom.edge_refusal('malformed')$$, 'MR032', null, 'malformed UTF-8: MR032');
SELECT throws_ok(
    $$SELECT mailroom.edge_refusal('json_depth', 64)$$, 'MR033', 'the JSON body nests deeper than 64 levels',
    'JSON nested too deep: MR033 names the bound'
);
SELECT throws_ok($$SELECT mailroom.edge_refusal('other')$$, '22023', null, 'an unknown refusal is a usage error');
SELECT results_eq(
    $$SELECT code, http_status::int FROM mailroom.error_codes() WHERE code BETWEEN 'MR030' AND 'MR033' ORDER BY code$$,
    $$VALUES ('MR030', 413), ('MR031', 400), ('MR032', 400), ('MR033', 400)$$,
    'each refusal has its HTTP status'
);

SET LOCAL ROLE mailroom_http;
SELECT throws_ok($$SELECT mailroom.edge_refusal('nul')$$, 'MR031', null, 'mailroom_http asks for a refusal');
RESET ROLE;
SET LOCAL ROLE mailroom_app;
SELECT throws_ok($$SELECT mailroom.edge_refusal('nul')$$, '42501', null, 'another role may not');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
