-- Outbound: attachments (enqueue_message_with_attachments, _outbound_attachments, the claim's column).
BEGIN;
SELECT plan(14);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: the claim and the dequeue take rows made by then, the
-- test's alone (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);

CREATE TEMP TABLE made (k text PRIMARY KEY, id bigint);
INSERT INTO made VALUES
(
    'two', mailroom.enqueue_message_with_attachments(
        'tap', ARRAY['a@example.com'], 'report', 'see attached',
        jsonb_build_array(
            jsonb_build_object('name', 'bytes.bin', 'content_type', 'application/octet-stream',
                'content_base64', encode((SELECT string_agg(set_byte('\x00'::bytea, 0, g), ''::bytea) FROM generate_series(0, 255) AS g), 'base64')),
            jsonb_build_object('name', 'résumé.txt', 'content_type', 'Text/Plain', 'content_base64', encode(convert_to('héllo', 'UTF8'), 'base64'))
        )
    )
),
('plain', mailroom.enqueue_message('tap', ARRAY['b@example.com'], 'plain', 'no attachment')),
('empty', mailroom.enqueue_message_with_attachments('tap', ARRAY['c@example.com'], 'empty', 'none', '[]'));

SELECT is(
    (SELECT cardinality(m.attachments) FROM mailroom.outbound_messages AS m WHERE m.id = (SELECT id FROM made WHERE k = 'two')),
    2, 'two attachments are stored with the message'
);
SELECT is(
    (SELECT (m.attachments[1]).content FROM mailroom.outbound_messages AS m WHERE m.id = (SELECT id FROM made WHERE k = 'two')),
    (SELECT string_agg(set_byte('\x00'::bytea, 0, g), ''::bytea) FROM generate_series(0, 255) AS g),
    'every byte value survives'
);
SELECT is(
    (SELECT (m.attachments[2]).name || ' ' || (m.attachments[2]).content_type
     FROM mailroom.outbound_messages AS m WHERE m.id = (SELECT id FROM made WHERE k = 'two')),
    'résumé.txt text/plain', 'the name is kept as given, the content type in lower case'
);
SELECT ok(
    (SELECT m.attachments IS NULL FROM mailroom.outbound_messages AS m WHERE m.id = (SELECT id FROM made WHERE k = 'empty')),
    'an empty list is no attachments (NULL)'
);

SELECT throws_ok(
    $$SELECT mailroom.enqueue_message_with_attachments('tap', ARRAY['a@example.com'], 's', 't',
        '[{"name": "../etc/passwd", "content_type": "text/plain", "content_base64": "eA=="}]')$$,
    'MR385', 'attachment 1: the name must be 1-255 characters, no path separator or control character',
    'a path is no attachment name'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message_with_attachments('tap', ARRAY['a@example.com'], 's', 't',
        jsonb_build_array('{"name": "a.txt", "content_type": "text/plain", "content_base64": "eA=="}'::jsonb,
            jsonb_build_object('name', E'a\r\nBcc: x@example.com', 'content_type', 'text/plain', 'content_base64', 'eA==')))$$,
    'MR385', 'attachment 2: the name must be 1-255 characters, no path separator or control character',
    'a name with CR LF is refused, by position'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message_with_attachments('tap', ARRAY['a@example.com'], 's', 't',
        '[{"name": "a.txt", "content_type": "text", "content_base64": "eA=="}]')$$,
    'MR385', 'attachment 1: the content type must be type/subtype (not multipart)', 'a content type needs a subtype'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message_with_attachments('tap', ARRAY['a@example.com'], 's', 't',
        '[{"name": "a.txt", "content_type": "multipart/mixed", "content_base64": "eA=="}]')$$,
    'MR385', 'attachment 1: the content type must be type/subtype (not multipart)', 'an attachment is never multipart'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message_with_attachments('tap', ARRAY['a@example.com'], 's', 't',
        '[{"name": "a.txt", "content_type": "text/plain", "content_base64": "not base64!"}]')$$,
    'MR385', 'attachment 1: content_base64 must be base64', 'content must be base64'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message_with_attachments('tap', ARRAY['a@example.com'], 's', 't',
        (SELECT jsonb_agg(jsonb_build_object('name', 'a' || g, 'content_type', 'text/plain', 'content_base64', 'eA=='))
         FROM generate_series(1, 21) AS g))$$,
    'MR385', 'attachments must be a JSON array of at most 20 objects', 'at most 20 attachments'
);
SELECT mailroom.set_setting('outbound.max_message_bytes', '300');
SELECT throws_like(
    $$SELECT mailroom.enqueue_message_with_attachments('tap', ARRAY['a@example.com'], 's', 't',
        jsonb_build_array(jsonb_build_object('name', 'big.bin', 'content_type', 'application/octet-stream',
            'content_base64', encode(convert_to(repeat('x', 400), 'UTF8'), 'base64'))))$$,
    'message too large: % bytes (outbound.max_message_bytes is 300)', 'attachments count against outbound.max_message_bytes (MR306)'
);
SELECT mailroom.set_setting('outbound.max_message_bytes', '10485760');

-- the claim hands them to the sender, base64 in JSON, only for the messages that have any
CREATE TEMP TABLE claimed AS SELECT * FROM mailroom.claim_messages(10, 'tap-worker');
SELECT is(
    (SELECT c.attachments -> 1 ->> 'name' FROM claimed AS c WHERE c.id = (SELECT id FROM made WHERE k = 'two')),
    'résumé.txt', 'the claim returns the attachments in order'
);
SELECT is(
    (SELECT decode(c.attachments -> 0 ->> 'content_base64', 'base64') FROM claimed AS c WHERE c.id = (SELECT id FROM made WHERE k = 'two')),
    (SELECT string_agg(set_byte('\x00'::bytea, 0, g), ''::bytea) FROM generate_series(0, 255) AS g),
    'and their bytes'
);
SELECT ok(
    (SELECT c.attachments IS NULL FROM claimed AS c WHERE c.id = (SELECT id FROM made WHERE k = 'plain')),
    'a message without attachments has none in the claim'
);

SELECT * FROM finish();
ROLLBACK;
