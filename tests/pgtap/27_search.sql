-- Search: search_messages matches subject, from and text (the HTML's text without a text part),
-- best first, authorized like list_messages; index_messages fills the vector after delivery (never
-- deliver_message), and an unfilled message is found all the same.
BEGIN;
SELECT plan(14);

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE b AS SELECT * FROM mailroom.create_mailbox(30, 'free');
CREATE TEMP TABLE other AS SELECT * FROM mailroom.create_mailbox(30, 'free');
CREATE TEMP TABLE g (k text, id bigint);
INSERT INTO g SELECT 'welcome', mailroom.deliver_message(
    (SELECT address FROM b), '\x31'::bytea, 'app@example.org', 'Welcome to Example', 'Example App <app@example.org>',
    'Activate your account with code 48213', null
);
INSERT INTO g SELECT 'invoice', mailroom.deliver_message(
    (SELECT address FROM b), '\x32'::bytea, 'billing@shop.test', 'Your invoice', 'Shop <billing@shop.test>',
    null, '<p>Invoice <b>number</b> 7 for your account</p><script>var hidden = "zebra";</script>'
);
INSERT INTO g SELECT 'elsewhere', mailroom.deliver_message(
    (SELECT address FROM other), '\x33'::bytea, 'app@example.org', 'Welcome to Example', null, 'account', null
);
CREATE FUNCTION pg_temp.found(p_query text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(g.k, ',' ORDER BY s.n), '')
    FROM mailroom.search_messages((SELECT address FROM b), (SELECT session_token FROM b), p_query)
        WITH ORDINALITY AS s (message_id, received_at, from_header, subject, rank, n)
    INNER JOIN g ON g.id = s.message_id
$$;

SELECT is(
    (SELECT count(*)::int FROM mailroom.messages WHERE search_vector IS NOT NULL), 0,
    'delivery does not compute the search vector'
);
SELECT is(pg_temp.found('welcome'), 'welcome', 'a subject word, unfilled messages matched on the fly');
SELECT is(pg_temp.found('48213'), 'welcome', 'a code in the text');
SELECT is(pg_temp.found('shop'), 'invoice', 'a word of the From address');
SELECT is(pg_temp.found('billing@shop.test'), 'invoice', 'the whole address');
SELECT is(pg_temp.found('invoice number'), 'invoice', 'the HTML part''s text when there is no text part');
SELECT is(pg_temp.found('zebra'), '', 'not the HTML''s script');
SELECT is(
    (SELECT string_agg(k, ',' ORDER BY k) FROM unnest(string_to_array(pg_temp.found('account'), ',')) AS f (k)),
    'invoice,welcome', 'both, and only this inbox''s'
);
SELECT is(pg_temp.found('account -invoice'), 'welcome', 'websearch syntax: -word');
SELECT is(
    mailroom.index_messages(ARRAY(SELECT id FROM g)), 3, 'index_messages fills the vectors'
);
SELECT is(mailroom.index_messages(ARRAY(SELECT id FROM g)), 0, 'and skips those filled already');
SELECT is(pg_temp.found('account -invoice'), 'welcome', 'the same answers from the filled vectors');
SELECT throws_ok($$SELECT pg_temp.found('  - ')$$, 'MR246', NULL, 'a query without a word: MR246');
SELECT throws_ok(
    format($$SELECT * FROM mailroom.search_messages(%L, 'wrong', 'account')$$, (SELECT address FROM b)),
    'MR204', NULL, 'a wrong token: MR204'
);

SELECT * FROM finish();
ROLLBACK;
