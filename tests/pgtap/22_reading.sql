-- Reading a mailbox: list_messages and read_message — authorization, expired and deleted
-- mailboxes, ordering, paging and its errors, the read flag.
BEGIN;
SELECT plan(43);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: expire_mailboxes meets this test's inboxes alone
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
CREATE TEMP TABLE b AS
SELECT 'anon' AS k, * FROM mailroom.create_mailbox(10, 'free');
INSERT INTO b SELECT 'owned', * FROM mailroom.create_mailbox(30, 'pro', 'api', 'client-1');
INSERT INTO b SELECT 'other', * FROM mailroom.create_mailbox(30, 'free');
INSERT INTO b SELECT 'doomed', * FROM mailroom.create_mailbox(30, 'free');
CREATE FUNCTION pg_temp.addr(text) RETURNS text LANGUAGE sql AS $$ SELECT address FROM b WHERE k = $1 $$;
CREATE FUNCTION pg_temp.tok(text) RETURNS text LANGUAGE sql AS $$ SELECT session_token FROM b WHERE k = $1 $$;

-- Messages arrive out of id order in time: x at 00:03, then y and z at 00:01 (same instant).
CREATE TEMP TABLE g (k text, id bigint);
SET LOCAL mailroom.clock = '2000-01-01 00:03:00+00';
INSERT INTO g SELECT 'x', mailroom.deliver_message(pg_temp.addr('anon'), '\x78'::bytea, 'x@example.org', 'X');
SET LOCAL mailroom.clock = '2000-01-01 00:01:00+00';
INSERT INTO g SELECT 'y', mailroom.deliver_message(pg_temp.addr('anon'), '\x79'::bytea, 'y@example.org', 'Y');
INSERT INTO g SELECT 'z', mailroom.deliver_message(pg_temp.addr('anon'), '\x7a'::bytea, 'z@example.org', 'Z');
INSERT INTO g SELECT 'w', mailroom.deliver_message(pg_temp.addr('other'), '\x77'::bytea, 'w@example.org', 'W');
INSERT INTO g SELECT 'o', mailroom.deliver_message(pg_temp.addr('owned'), '\x6f'::bytea, 'o@example.org', 'O');
INSERT INTO g SELECT 'd', mailroom.deliver_message(pg_temp.addr('doomed'), '\x64'::bytea, 'd@example.org', 'D');
CREATE FUNCTION pg_temp.mid(text) RETURNS bigint LANGUAGE sql AS $$ SELECT id FROM g WHERE k = $1 $$;
SET LOCAL mailroom.clock = '2000-01-01 00:05:00+00';

-- ordering and paging
SELECT results_eq(
    format('SELECT subject FROM mailroom.list_messages(%L, %L)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    $$VALUES ('Y'), ('Z'), ('X')$$,
    'oldest first by received_at, then by id for messages received at the same instant'
);
SELECT results_eq(
    format('SELECT subject FROM mailroom.list_messages(%L, %L, p_limit => 2)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    $$VALUES ('Y'), ('Z')$$,
    'p_limit caps the page'
);
SELECT results_eq(
    format('SELECT subject FROM mailroom.list_messages(%L, %L, p_limit => 1, p_offset => 1)',
        pg_temp.addr('anon'), pg_temp.tok('anon')),
    $$VALUES ('Z')$$,
    'p_offset skips the first messages of the same order'
);
SELECT is(
    (SELECT count(*) FROM mailroom.list_messages(pg_temp.addr('anon'), pg_temp.tok('anon'), p_offset => 3)),
    0::bigint,
    'an offset past the end is an empty page, not an error'
);
SELECT results_eq(
    format('SELECT message_id, envelope_from, envelope_to, subject, size_bytes, received_at, is_read
            FROM mailroom.list_messages(%L, %L) WHERE subject = %L', pg_temp.addr('anon'), pg_temp.tok('anon'), 'X'),
    format($$VALUES (%s::bigint, 'x@example.org', %L, 'X', 1, '2000-01-01 00:03:00+00'::timestamptz, false)$$,
        pg_temp.mid('x'), pg_temp.addr('anon')),
    'list_messages returns the stored fields of each message, unread'
);
SELECT is(
    (SELECT count(*) FROM mailroom.list_messages(pg_temp.addr('anon'), pg_temp.tok('anon')) WHERE subject = 'W'),
    0::bigint,
    'only the messages of that mailbox'
);

SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L, p_limit => 0)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    '22023', 'p_limit must be positive and p_offset non-negative', 'p_limit 0 is refused'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L, p_limit => -1)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    '22023', 'p_limit must be positive and p_offset non-negative', 'a negative p_limit is refused'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L, p_limit => NULL)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    '22023', 'p_limit must be positive and p_offset non-negative', 'a NULL p_limit is refused'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L, p_offset => -1)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    '22023', 'p_limit must be positive and p_offset non-negative', 'a negative p_offset is refused'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L, p_offset => NULL)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    '22023', 'p_limit must be positive and p_offset non-negative', 'a NULL p_offset is refused'
);

-- authorization
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)', pg_temp.addr('anon'), pg_temp.tok('other')),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)', 'list with another mailbox''s token: MR204'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, NULL, %s)', pg_temp.addr('anon'), pg_temp.mid('x')),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)', 'read without a token: MR204'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, %L, %s)', 'nobody@mailroom.test', 'x', pg_temp.mid('x')),
    'MR203', 'mailbox not found', 'read from an unknown address: MR203'
);
SELECT results_eq(
    format('SELECT subject FROM mailroom.list_messages(%L, NULL, %L, %L)', upper(pg_temp.addr('owned')), 'api', 'client-1'),
    $$VALUES ('O')$$,
    'the owner lists its mailbox without a token (address in any case)'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, NULL, %s, %L, %L)', pg_temp.addr('owned'), pg_temp.mid('o'), 'api', 'client-2'),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)', 'another owner cannot read it'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, NULL, %s, %L, %L)', pg_temp.addr('owned'), pg_temp.mid('o'), 'mcp', 'client-1'),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)', 'the owner type must match'
);
SELECT is(
    (SELECT bool_or(is_read) FROM mailroom.messages WHERE id IN (SELECT id FROM g)),
    false,
    'refused reads and listing mark nothing read'
);

-- read_message and the read flag
SELECT results_eq(
    format('SELECT message_id, subject, raw, is_read FROM mailroom.read_message(%L, %L, %s)',
        pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('z')),
    format($$VALUES (%s::bigint, 'Z', '\x7a'::bytea, true)$$, pg_temp.mid('z')),
    'read_message returns the message with its raw bytes, marked read'
);
SELECT results_eq(
    format('SELECT subject, is_read FROM mailroom.list_messages(%L, %L)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    $$VALUES ('Y', false), ('Z', true), ('X', false)$$,
    'the read flag is stored for that message only'
);
SELECT results_eq(
    format('SELECT is_read FROM mailroom.read_message(%L, %L, %s)', pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('z')),
    $$VALUES (true)$$,
    'reading it again works and it stays read'
);
SELECT results_eq(
    format('SELECT subject FROM mailroom.read_message(%L, NULL, %s, %L, %L)', pg_temp.addr('owned'), pg_temp.mid('o'), 'api', 'client-1'),
    $$VALUES ('O')$$,
    'the owner reads a message of its mailbox'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, %L, %s)', pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('w')),
    'MR209', format('message %s not found in this mailbox', pg_temp.mid('w')),
    'a message of another mailbox: MR209, and it is not marked read'
);
SELECT is((SELECT is_read FROM mailroom.messages WHERE id = pg_temp.mid('w')), false, 'the other mailbox''s message stays unread');
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, %L, %s)', pg_temp.addr('anon'), pg_temp.tok('anon'), -1),
    'MR209', 'message -1 not found in this mailbox', 'an unknown message id: MR209'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, %L, NULL)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    'MR209', 'message NULL not found in this mailbox', 'a NULL message id: MR209 that says NULL'
);

-- deleted: MR206 for list and read, after authorization
SELECT mailroom.delete_mailbox(pg_temp.addr('doomed'), pg_temp.tok('doomed'));
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)', pg_temp.addr('doomed'), pg_temp.tok('doomed')),
    'MR206', 'mailbox was deleted at 2000-01-01 00:05:00+00', 'listing a deleted mailbox: MR206'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, %L, %s)', pg_temp.addr('doomed'), pg_temp.tok('doomed'), pg_temp.mid('d')),
    'MR206', 'mailbox was deleted at 2000-01-01 00:05:00+00', 'reading from a deleted mailbox: MR206'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)', pg_temp.addr('doomed'), pg_temp.tok('anon')),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)',
    'a deleted mailbox is revealed only to an authorized caller'
);
SELECT is((SELECT is_read FROM mailroom.messages WHERE id = pg_temp.mid('d')), false, 'nothing was marked read');

-- expired: MR205 from the expiry instant, whether or not the sweep ran
SET LOCAL mailroom.clock = '2000-01-01 00:09:59.999999+00';
SELECT is(
    (SELECT count(*) FROM mailroom.list_messages(pg_temp.addr('anon'), pg_temp.tok('anon'))), 3::bigint,
    'readable 1 us before expiry'
);
SET LOCAL mailroom.clock = '2000-01-01 00:10:00+00';
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    'MR205', 'mailbox expired at 2000-01-01 00:10:00+00', 'listing at the expiry instant: MR205, not an empty list'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.read_message(%L, %L, %s)', pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('x')),
    'MR205', 'mailbox expired at 2000-01-01 00:10:00+00', 'reading at the expiry instant: MR205'
);
SELECT is((SELECT is_read FROM mailroom.messages WHERE id = pg_temp.mid('x')), false, 'the refused read marked nothing');
SELECT is(mailroom.expire_mailboxes(), 1, 'the sweep flips it');
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)', pg_temp.addr('anon'), pg_temp.tok('anon')),
    'MR205', 'mailbox expired at 2000-01-01 00:10:00+00', 'after the sweep: still MR205'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)', pg_temp.addr('anon'), 'wrong'),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)',
    'an expired mailbox is revealed only to an authorized caller'
);

-- inline images (issue 44 item 3): which cid: references of an HTML part may show which part
CREATE FUNCTION pg_temp.part(p_cid text, p_type text, p_size bigint, p_sha text DEFAULT repeat('a', 64))
RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_build_object('filename', null, 'content_type', p_type, 'disposition', 'inline', 'size', p_size,
                              'content_id', p_cid, 'sha256', p_sha)
$$;
SELECT is(
    mailroom_internal._inline_images(
        '<img src="cid:logo@x"><div style="background:url(CID:bg@x)"></div><img src=''cid:logo@x''>',
        jsonb_build_array(pg_temp.part('bg@x', 'image/gif', 10, repeat('b', 64)), pg_temp.part('logo@x', 'image/png', 20),
                          pg_temp.part('logo@x', 'image/jpeg', 30, repeat('c', 64)), pg_temp.part('unused@x', 'image/png', 5))),
    '[{"cid": "logo@x", "content_type": "image/png", "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "size": 20},
      {"cid": "bg@x", "content_type": "image/gif", "sha256": "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "size": 10}]'::jsonb,
    'inline images: each referenced image once, in order of first reference, the first part of a Content-ID, CSS url() too'
);
SELECT is(
    mailroom_internal._inline_images('<img src="cid:nope@x">', jsonb_build_array(pg_temp.part('logo@x', 'image/png', 20))),
    '[]'::jsonb, 'a reference without its part: left out'
);
SELECT is(
    mailroom_internal._inline_images(
        '<img src="cid:big@x"><img src="cid:ok@x">',
        jsonb_build_array(pg_temp.part('big@x', 'image/png', 2097153), pg_temp.part('ok@x', 'image/png', 2097152))) -> 0 ->> 'cid',
    'ok@x', 'a part over 2 MiB: left out; one of 2 MiB: shown'
);
SELECT is(
    mailroom_internal._inline_images(
        '<img src="cid:s@x"><img src="cid:t@x"><img src="cid:b@x">',
        jsonb_build_array(pg_temp.part('s@x', 'image/svg+xml', 10), pg_temp.part('t@x', 'text/html', 10),
                          pg_temp.part('b@x', 'image/png', 10, 'not-a-digest'))),
    '[]'::jsonb, 'SVG, a part that is no image, a part without its digest: left out'
);
SELECT is(
    (SELECT jsonb_path_query_array(mailroom_internal._inline_images(
        (SELECT string_agg(format('<img src="cid:p%s@x">', i), '') FROM generate_series(1, 5) AS i),
        (SELECT jsonb_agg(pg_temp.part(format('p%s@x', i), 'image/png', 2097152)) FROM generate_series(1, 5) AS i)),
        '$[*].cid')),
    '["p1@x", "p2@x", "p3@x", "p4@x"]'::jsonb, 'at most 8 MiB in all: the first four parts of 2 MiB, not the fifth'
);
SELECT is(
    mailroom_internal._inline_images(null, jsonb_build_array(pg_temp.part('logo@x', 'image/png', 20))) ||
    mailroom_internal._inline_images('<img src="cid:logo@x">', null),
    '[]'::jsonb, 'no HTML or no parts: none'
);

SELECT * FROM finish();
ROLLBACK;
