-- Marks on messages (sql/22_marks.sql): the tag set's stored form and its limits (MR260, MR261),
-- read/unread, replacing tags, deleting selected (MR262) or all messages and the freed places;
-- plus-addressing at delivery (box+tag@domain: stored in box@domain, tagged).
BEGIN;
SELECT plan(22);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE b AS SELECT 'anon' AS k, * FROM mailroom.create_mailbox(10, 'free');
INSERT INTO b SELECT 'other', * FROM mailroom.create_mailbox(10, 'free');
CREATE FUNCTION pg_temp.addr(text) RETURNS text LANGUAGE sql AS $$ SELECT address FROM b WHERE k = $1 $$;
CREATE FUNCTION pg_temp.tok(text) RETURNS text LANGUAGE sql AS $$ SELECT session_token FROM b WHERE k = $1 $$;
CREATE FUNCTION pg_temp.plus(text, text) RETURNS text LANGUAGE sql AS $$
    SELECT replace(pg_temp.addr($1), '@', '+' || $2 || '@')
$$;
CREATE TEMP TABLE g (k text, id bigint);
INSERT INTO g SELECT 'x', mailroom.deliver_message(pg_temp.addr('anon'), '\x78'::bytea, 'x@example.org', 'X');
INSERT INTO g SELECT 'y', mailroom.deliver_message(pg_temp.plus('anon', 'Invoices'), '\x79'::bytea, 'y@example.org', 'Y');
INSERT INTO g SELECT 'z', mailroom.deliver_message(pg_temp.plus('anon', 'bad!tag'), '\x7a'::bytea, 'z@example.org', 'Z');
INSERT INTO g SELECT 'w', mailroom.deliver_message(pg_temp.addr('other'), '\x77'::bytea, 'w@example.org', 'W');
CREATE FUNCTION pg_temp.mid(text) RETURNS bigint LANGUAGE sql AS $$ SELECT id FROM g WHERE k = $1 $$;
CREATE FUNCTION pg_temp.tags(text) RETURNS text[] LANGUAGE sql AS $$
    SELECT m.tags FROM mailroom.messages AS m WHERE m.id = pg_temp.mid($1)
$$;

-- plus-addressing at delivery
SELECT is(pg_temp.tags('x'), '{}'::text[], 'a plain address: no tag');
SELECT is(pg_temp.tags('y'), '{invoices}'::text[], 'box+Invoices@: tagged invoices (lower case)');
SELECT is(
    (SELECT m.mailbox_id FROM mailroom.messages AS m WHERE m.id = pg_temp.mid('y')),
    (SELECT b.mailbox_id FROM b WHERE b.k = 'anon'), 'box+tag@ is stored in box@'
);
SELECT is(pg_temp.tags('z'), '{}'::text[], 'a plus part that is no tag: stored in the box, untagged');
SELECT is(
    (SELECT m.envelope_to FROM mailroom.messages AS m WHERE m.id = pg_temp.mid('y')),
    pg_temp.plus('anon', 'Invoices'), 'to_address keeps the address as written'
);

-- the tag set's stored form and its limits
SELECT is(mailroom_internal._message_tags(ARRAY[' B ', 'a', 'b', 'x.y_z-1']), '{a,b,x.y_z-1}'::text[],
    'trimmed, lower case, distinct, sorted');
SELECT is(mailroom_internal._message_tags(NULL), '{}'::text[], 'NULL: no tags');
SELECT throws_ok($$SELECT mailroom_internal._message_tags(ARRAY['no spaces'])$$, 'MR260', NULL, 'a character outside [a-z0-9._-]: MR260');
SELECT throws_ok($$SELECT mailroom_internal._message_tags(ARRAY[''])$$, 'MR260', NULL, 'an empty tag: MR260');
SELECT throws_ok($$SELECT mailroom_internal._message_tags(ARRAY[repeat('a', 65)])$$, 'MR260', NULL, 'a tag over 64 characters: MR260');
SELECT throws_ok($$SELECT mailroom_internal._message_tags(ARRAY[NULL::text])$$, 'MR260', NULL, 'a NULL tag: MR260');
SELECT throws_ok(
    $$SELECT mailroom_internal._message_tags(ARRAY(SELECT 't' || i FROM generate_series(1, 21) AS i))$$, 'MR261', NULL,
    '21 tags: MR261'
);

-- mark_message
SELECT is(
    (SELECT row(m.is_read, m.tags)::text FROM mailroom.mark_message(pg_temp.addr('anon'), pg_temp.tok('anon'),
        pg_temp.mid('x'), p_tags => ARRAY['Urgent', 'work']) AS m),
    '(f,"{urgent,work}")', 'tags replaced, the read mark untouched'
);
SELECT is(
    (SELECT row(m.is_read, m.tags)::text FROM mailroom.mark_message(pg_temp.addr('anon'), pg_temp.tok('anon'),
        pg_temp.mid('x'), p_is_read => true) AS m),
    '(t,"{urgent,work}")', 'marked read, the tags untouched'
);
SELECT is(
    (SELECT m.is_read FROM mailroom.mark_message(pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('x'), false) AS m),
    false, 'marked unread again'
);
SELECT throws_ok(
    format('SELECT mailroom.mark_message(%L, %L, %s, true)', pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('w')),
    'MR209', NULL, 'a message of another inbox: MR209'
);
SELECT throws_ok(
    format('SELECT mailroom.mark_message(%L, %L, %s, true)', pg_temp.addr('anon'), pg_temp.tok('other'), pg_temp.mid('x')),
    'MR204', NULL, 'another inbox''s token: MR204'
);

-- delete selected, then all
SELECT throws_ok(
    format('SELECT mailroom.delete_inbox_messages(%L, %L, %L::bigint[])', pg_temp.addr('anon'), pg_temp.tok('anon'), '{}'),
    'MR262', NULL, 'an empty list of ids: MR262'
);
SELECT is(
    mailroom.delete_inbox_messages(pg_temp.addr('anon'), pg_temp.tok('anon'), ARRAY[pg_temp.mid('x'), pg_temp.mid('w')]), 1,
    'selected: only this inbox''s messages are deleted and counted'
);
SELECT is(
    (SELECT m.message_count FROM mailroom.mailboxes AS m WHERE m.address = pg_temp.addr('anon')), 2,
    'the deleted message freed its place'
);
SELECT is(mailroom.delete_inbox_messages(pg_temp.addr('anon'), pg_temp.tok('anon')), 2, 'all (NULL ids): the other two');
SELECT is(
    (SELECT row(m.message_count, m.is_active, (SELECT count(*) FROM mailroom.messages AS g WHERE g.mailbox_id = m.id))::text
     FROM mailroom.mailboxes AS m WHERE m.address = pg_temp.addr('anon')),
    '(0,t,0)', 'the inbox stays, empty, its count 0'
);

SELECT * FROM finish();
ROLLBACK;
