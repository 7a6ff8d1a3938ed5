-- Search (issue 35): words as prefixes and, from 3 characters, substrings; qualifiers; phrases;
-- -negation and or; addresses and domains by their parts; bounds of the query; authorized like
-- list_messages; index_messages fills the vector after delivery (never deliver_message), a message
-- unfilled or filled by an older definition is matched with its vector computed on the fly, and
-- reindex_messages rebuilds the old ones.
BEGIN;
SELECT plan(67);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE b AS SELECT * FROM mailroom.create_mailbox(30, 'free');
CREATE TEMP TABLE other AS SELECT * FROM mailroom.create_mailbox(30, 'free');
CREATE TEMP TABLE g (k text, id bigint);
SET LOCAL mailroom.clock = '2029-12-31 23:00:00+00';
INSERT INTO g SELECT 'welcome', mailroom.deliver_message(
    (SELECT address FROM b), '\x31'::bytea, 'app@example.org', 'Welcome to Example', 'Example App <app@example.org>',
    'Activate your account with code 48213, and enjoy a pineapple', null
);
SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
INSERT INTO g SELECT 'invoice', mailroom.deliver_message(
    (SELECT address FROM b), '\x32'::bytea, 'billing@shop.example.org', 'Your invoice', 'Shop <billing@shop.example.org>',
    null, '<p>Invoice <b>number</b> 7 for your account</p><script>var hidden = "zebra";</script>',
    '[{"filename": "invoice.pdf", "content_type": "application/pdf", "size": 3}]'
);
INSERT INTO g SELECT 'elsewhere', mailroom.deliver_message(
    (SELECT address FROM other), '\x33'::bytea, 'app@example.org', 'Welcome to Example', null, 'account', null
);
UPDATE mailroom.messages SET is_read = true WHERE id = (SELECT id FROM g WHERE k = 'welcome');
-- the keys found, in the order found
CREATE FUNCTION pg_temp.found(p_query text, p_limit integer DEFAULT 50) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(g.k, ',' ORDER BY s.n), '')
    FROM mailroom.search_messages(
        (SELECT address FROM b), (SELECT session_token FROM b), p_query, p_limit => p_limit
    ) WITH ORDINALITY AS s (message_id, received_at, from_header, subject, rank, n)
    INNER JOIN g ON g.id = s.message_id
$$;
-- the keys found, sorted
CREATE FUNCTION pg_temp.found_set(p_query text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(f.k, ',' ORDER BY f.k), '')
    FROM unnest(string_to_array(nullif(pg_temp.found(p_query), ''), ',')) AS f (k)
$$;

SELECT is(
    (SELECT count(*)::int FROM mailroom.messages WHERE search_vector IS NOT NULL), 0,
    'delivery does not compute the search vector'
);
-- words (unfilled messages, matched on the fly)
SELECT is(pg_temp.found('welcome'), 'welcome', 'a subject word, unfilled messages matched on the fly');
SELECT is(pg_temp.found('48213'), 'welcome', 'a code in the text');
SELECT is(pg_temp.found('invoice number'), 'invoice', 'the HTML part''s text when there is no text part');
SELECT is(pg_temp.found('zebra'), '', 'not the HTML''s script');
SELECT is(pg_temp.found_set('account'), 'invoice,welcome', 'both, and only this inbox''s');
SELECT is(pg_temp.found('Account Activate'), 'welcome', 'every word must match, whatever its case');
-- prefix and substring
SELECT is(pg_temp.found('pine'), 'welcome', 'prefix: pine finds pineapple');
SELECT is(pg_temp.found('pine*'), 'welcome', 'prefix: pine*');
SELECT is(pg_temp.found('invoic'), 'invoice', 'prefix: invoic finds invoice');
SELECT is(pg_temp.found('apple'), 'welcome', 'substring: apple finds pineapple');
SELECT is(pg_temp.found('voic'), 'invoice', 'substring: voic finds invoice');
SELECT is(pg_temp.found('apple*'), '', 'word* is a prefix only');
SELECT is(pg_temp.found_set('ex'), 'invoice,welcome', 'a short word is a prefix (example)');
SELECT is(pg_temp.found('pl'), '', 'and only a prefix (not in pineapple)');
-- addresses and domains by their parts
SELECT is(pg_temp.found('shop'), 'invoice', 'a word of the From address');
SELECT is(pg_temp.found('billing@shop.example.org'), 'invoice', 'the whole address');
SELECT is(pg_temp.found('billing'), 'invoice', 'its local part');
SELECT is(pg_temp.found('shop.example.org'), 'invoice', 'its domain');
SELECT is(pg_temp.found_set('example.org'), 'invoice,welcome', 'its parent domain');
SELECT is(pg_temp.found('BILLING@Shop.Example.ORG'), 'invoice', 'an address in any case');
-- phrases, negation, or
SELECT is(pg_temp.found('"invoice number"'), 'invoice', 'a phrase');
SELECT is(pg_temp.found('"number invoice"'), '', 'a phrase is in order');
SELECT is(pg_temp.found('account -invoice'), 'welcome', '-word');
SELECT is(pg_temp.found('account -"your invoice"'), 'welcome', '-"a phrase"');
SELECT is(pg_temp.found_set('pineapple or invoice'), 'invoice,welcome', 'a or b');
SELECT is(pg_temp.found('zebra OR 48213 account'), 'welcome', '(a or b) and c');
SELECT is(pg_temp.found('code:48213'), 'welcome', 'an unknown qualifier is a word as written');
-- qualifiers
SELECT is(pg_temp.found('from:billing'), 'invoice', 'from:');
SELECT is(pg_temp.found_set('from:example.org'), 'invoice,welcome', 'from: a domain');
SELECT is(pg_temp.found('from:invoice'), '', 'from: not the subject');
SELECT is(pg_temp.found('subject:invoice'), 'invoice', 'subject:');
SELECT is(pg_temp.found('subject:account'), '', 'subject: not the text');
SELECT is(pg_temp.found('subject:"to example"'), 'welcome', 'subject:"a phrase"');
SELECT is(
    pg_temp.found_set(format('to:%s', (SELECT address FROM b))), 'invoice,welcome', 'to: the recipient'
);
SELECT is(pg_temp.found(split_part((SELECT address FROM b), '@', 1)), '', 'a bare word is not the recipient');
SELECT is(pg_temp.found('is:unread'), 'invoice', 'is:unread');
SELECT is(pg_temp.found('is:read account'), 'welcome', 'is:read');
SELECT is(pg_temp.found('has:attachment'), 'invoice', 'has:attachment');
SELECT is(pg_temp.found('-has:attachment'), 'welcome', '-has:attachment');
SELECT is(pg_temp.found('tag:billing'), '', 'tag: no message has the tag yet');
SELECT is(pg_temp.found('before:2030-01-01'), 'welcome', 'before: a UTC day');
SELECT is(pg_temp.found('after:2030-01-01'), 'invoice', 'after: from that day on');
-- bounds
SELECT throws_ok($$SELECT pg_temp.found(repeat('ab ', 334))$$, 'MR225', NULL, 'a query over 1000 characters');
SELECT throws_ok($$SELECT pg_temp.found(repeat('ab ', 17))$$, 'MR226', NULL, 'a query of 17 terms');
SELECT is(pg_temp.found(repeat('act ', 16) || 'or or'), 'welcome', 'sixteen terms (or not counted)');
SELECT throws_ok($$SELECT pg_temp.found('is:new')$$, 'MR227', NULL, 'is: read or unread');
SELECT throws_ok($$SELECT pg_temp.found('before:2030-02-30')$$, 'MR227', NULL, 'before: a day that is not');
SELECT throws_ok($$SELECT pg_temp.found('after:yesterday')$$, 'MR227', NULL, 'after: a date');
SELECT throws_ok($$SELECT pg_temp.found('  - "" ')$$, 'MR246', NULL, 'a query without a word: MR246');
SELECT is(pg_temp.found('account', 1), 'invoice', 'at most p_limit (the newest first among equals)');
-- filled vectors, old definitions, the rebuild
SELECT is(mailroom.index_messages(ARRAY(SELECT id FROM g)), 3, 'index_messages fills the vectors');
SELECT is(mailroom.index_messages(ARRAY(SELECT id FROM g)), 0, 'and skips those filled already');
SELECT is(
    pg_temp.found('voic from:example.org -is:read'), 'invoice', 'the same answers from the filled vectors'
);
-- a vector of an older definition (here: a wrong one) is not read: the message is matched on the fly
UPDATE mailroom.messages SET search_vector = to_tsvector('simple', 'zebra'), search_version = 1
WHERE id = (SELECT id FROM g WHERE k = 'invoice');
SELECT is(
    pg_temp.found('zebra') || '|' || pg_temp.found('shop.example.org'), '|invoice',
    'a vector of an old definition is computed on the fly'
);
-- a vector of the first definition (search_version NULL) is completed (the addresses' parts, the
-- recipient), not made again from the text
UPDATE mailroom.messages
SET
    search_vector = setweight(to_tsvector('simple', 'Welcome to Example'), 'A')
    || setweight(to_tsvector('simple', 'app example org'), 'B'),
    search_version = null
WHERE id = (SELECT id FROM g WHERE k = 'welcome');
SELECT is(
    pg_temp.found_set('from:example.org') || '|' || pg_temp.found('pineapple'), 'invoice,welcome|',
    'a vector of the first definition is completed with the addresses'' parts, its text not read again'
);
-- the walker's cursor just before this test's first message: it walks the test's three, whatever an
-- installation holds before them (the cursor row rolls back with the file; a walker running meanwhile
-- skips it, SKIP LOCKED)
UPDATE mailroom.search_reindex SET version = mailroom_internal._search_vector_version(), after_id = (SELECT min(id) - 1 FROM g)
WHERE only_row;
SELECT is(
    (SELECT row(walked, rebuilt)::text FROM mailroom.reindex_messages(2))
    || (SELECT row(walked, rebuilt)::text FROM mailroom.reindex_messages(2))
    || (SELECT row(walked, rebuilt)::text FROM mailroom.reindex_messages(2)),
    '(2,2)(1,0)(0,0)', 'reindex_messages walks in batches and rebuilds the old ones, then is at the end'
);
SELECT is(
    pg_temp.found('zebra') || '|' || pg_temp.found('pineapple') || '|'
    || (SELECT count(*) FROM mailroom.messages WHERE search_version = 2 AND id IN (SELECT id FROM g)),
    '|welcome|3', 'and the rebuilt vectors are of the current definition'
);
SELECT throws_ok($$SELECT * FROM mailroom.reindex_messages(0)$$, '22023', NULL, 'reindex_messages: a batch of 1 to 10000');

SELECT throws_ok(
    format($$SELECT * FROM mailroom.search_messages(%L, 'wrong', 'account')$$, (SELECT address FROM b)),
    'MR204', NULL, 'a wrong token: MR204'
);

-- tag: (sql/22_marks.sql)
UPDATE mailroom.messages SET tags = '{billing,q1}' WHERE id = (SELECT id FROM g WHERE k = 'invoice');
SELECT is(pg_temp.found('tag:billing'), 'invoice', 'tag: finds a message with the tag');
SELECT is(pg_temp.found('tag:Billing welcome'), '', 'tag: AND a word (lower case: as stored)');
SELECT is(pg_temp.found('-tag:q1'), 'welcome', '-tag: the others');

-- pages (issue 44 item 4): the search of several inboxes, newest first by id (the owner's all-mail
-- search), and the keyset after a best-first page's last message
CREATE FUNCTION pg_temp.paged(p_boxes bigint[], p_before text, p_newest boolean) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(g.k, ',' ORDER BY s.n), '')
    FROM mailroom_internal._search_mailboxes(
        p_boxes, 'account', 10, (SELECT id FROM g WHERE k = p_before), p_newest
    ) WITH ORDINALITY AS s (message_id, received_at, from_header, subject, rank, n)
    INNER JOIN g ON g.id = s.message_id
$$;
SELECT is(
    pg_temp.paged(ARRAY[(SELECT mailbox_id FROM b), (SELECT mailbox_id FROM other)], null, true),
    'elsewhere,invoice,welcome', 'several inboxes, newest first by id'
);
SELECT is(
    pg_temp.paged(ARRAY[(SELECT mailbox_id FROM b), (SELECT mailbox_id FROM other)], 'invoice', true),
    'welcome', 'newest first, before_id: those stored before it'
);
SELECT is(
    pg_temp.paged(ARRAY[(SELECT mailbox_id FROM b)], (SELECT split_part(pg_temp.found('account'), ',', 1)), false),
    (SELECT split_part(pg_temp.found('account'), ',', 2)), 'best first, before_id: what ranks after that page''s last'
);
SELECT throws_ok(
    format(
        'SELECT * FROM mailroom_internal._search_mailboxes(ARRAY[%s]::bigint[], %L, 10, %s)',
        (SELECT mailbox_id FROM b), 'account', (SELECT id FROM g WHERE k = 'elsewhere')
    ),
    'MR218', NULL, 'best first, a cursor that is not in the inbox (gone): MR218'
);

SELECT * FROM finish();
ROLLBACK;
