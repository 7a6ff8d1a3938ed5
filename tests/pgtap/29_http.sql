-- The HTTP API's functions: authorization by session token or API key owner (MR240/MR241/MR204),
-- anonymous plans (MR242), the creation rate limit (MR243), the JSON answers, an expired inbox
-- (MR205), deleting a message (its place is freed), attachments (MR250), one-look waits; the REST
-- v1 shapes (a list is a JSON array, the original service's keys), an API key's inbox list, and its
-- mcp inboxes read over REST.
BEGIN;
SELECT plan(100);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
SELECT mailroom.create_api_key('team-1', sha256('mrk_one'::bytea));
SELECT mailroom.create_api_key('team-2', sha256('mrk_two'::bytea));
SELECT mailroom.create_api_key('team-43', sha256('mrk_43'::bytea));
CREATE TEMP TABLE j AS SELECT mailroom.http_create_mailbox(null, '192.0.2.1', 5) AS doc;
CREATE TEMP TABLE o AS SELECT mailroom.http_create_mailbox(sha256('mrk_one'::bytea), null, null, 'pro') AS doc;
CREATE FUNCTION pg_temp.a() RETURNS text LANGUAGE sql AS $$ SELECT doc ->> 'address' FROM j $$;
CREATE FUNCTION pg_temp.t() RETURNS text LANGUAGE sql AS $$ SELECT doc ->> 'session_token' FROM j $$;
CREATE FUNCTION pg_temp.oa() RETURNS text LANGUAGE sql AS $$ SELECT doc ->> 'address' FROM o $$;

SELECT is(
    (SELECT row(doc ->> 'plan', doc ->> 'owner_type', doc ->> 'expires_at', length(doc ->> 'session_token'))::text FROM j),
    '(free,anonymous,2030-01-01T00:05:00+00:00,32)', 'anonymous: plan free, TTL, a session token'
);
SELECT is(
    (SELECT row(doc ->> 'plan', doc ->> 'owner_type', doc ->> 'session_token')::text FROM o),
    '(pro,api,)', 'with an API key: any plan, owned by the key''s owner, no token'
);
SELECT throws_ok($$SELECT mailroom.http_create_mailbox(null, 'c', null, 'pro')$$, 'MR242', NULL,
    'anonymous and another plan: MR242');
-- issue 43: MCP's create_inbox is this function (p_face 'mcp'): owner type mcp, and only with a key
SELECT is(
    (mailroom.http_create_mailbox(sha256('mrk_43'::bytea), null, p_face => 'mcp') ->> 'owner_type'), 'mcp',
    'p_face mcp: the inbox''s owner type is mcp'
);
SELECT throws_ok($$SELECT mailroom.http_create_mailbox(null, null, p_face => 'mcp')$$, 'MR240', NULL,
    'p_face mcp without an API key: MR240 (MCP knows only keys), nothing anonymous made');
SELECT is(
    (mailroom.http_create_mailbox(sha256('mrk_43'::bytea), 'c') ->> 'owner_type'), 'api',
    'the REST face (the default): owner type api'
);
SELECT throws_ok($$SELECT mailroom.http_create_mailbox(sha256('mrk_x'::bytea), 'c')$$, 'MR241', NULL,
    'an unknown key: MR241');
SELECT is(mailroom.http_get_mailbox(pg_temp.a(), pg_temp.t(), null) ->> 'address', pg_temp.a(), 'the token reads it');
SELECT throws_ok(format($$SELECT mailroom.http_get_mailbox(%L, null, null)$$, pg_temp.a()), 'MR240', NULL,
    'no credentials: MR240');
SELECT throws_ok(format($$SELECT mailroom.http_get_mailbox(%L, 'nope', null)$$, pg_temp.a()), 'MR204', NULL,
    'a wrong token: MR204');
SELECT is(mailroom.http_get_mailbox(pg_temp.oa(), null, sha256('mrk_one'::bytea)) ->> 'plan', 'pro',
    'the owner''s key reads its inbox');
SELECT throws_ok(format($$SELECT mailroom.http_get_mailbox(%L, null, sha256('mrk_two'::bytea))$$, pg_temp.oa()),
    'MR204', NULL, 'another owner''s key: MR204');
SELECT throws_ok(format($$SELECT mailroom.http_get_mailbox(%L, null, sha256('mrk_one'::bytea))$$, pg_temp.a()),
    'MR204', NULL, 'a key does not open an anonymous inbox');

-- fault injection over the API (issue 35, item 5): the owner rule, the Mailbox's fault, MR270
SELECT throws_ok(format($$SELECT mailroom.http_inbox_fault(%L, %L, null)$$, pg_temp.a(), pg_temp.t()), 'MR270', NULL,
    'no fault: MR270 (the route''s 404)');
SELECT is(mailroom.http_get_mailbox(pg_temp.a(), pg_temp.t(), null) -> 'fault', 'null'::jsonb,
    'the Mailbox''s fault is null when none');
SELECT is(
    (SELECT row(f ->> 'scope', f ->> 'stage', f ->> 'reply', f ->> 'share', f ->> 'remaining')::text
     FROM (SELECT mailroom.http_set_inbox_fault(pg_temp.a(), pg_temp.t(), null, 'after-data', '451 4.3.0 Lost ack', null, 2) AS f) AS r),
    '(inbox,after_data,"451 4.3.0 Lost ack",100.00,2)', 'http_set_inbox_fault with the token (share null: 100)'
);
SELECT is(mailroom.http_get_mailbox(pg_temp.a(), pg_temp.t(), null) -> 'fault' ->> 'stage', 'after_data',
    'the Mailbox shows its fault');
SELECT is(mailroom.http_inbox_fault(pg_temp.a(), pg_temp.t(), null) ->> 'remaining', '2', 'http_inbox_fault');
SELECT throws_ok(format($$SELECT mailroom.http_set_inbox_fault(%L, null, sha256('mrk_one'::bytea), 'rcpt', '451 4.3.0 x')$$,
    pg_temp.a()), 'MR204', NULL, 'a key does not set an anonymous inbox''s fault');
SELECT is(mailroom.http_set_inbox_fault(pg_temp.oa(), null, sha256('mrk_one'::bytea), 'rcpt', '550 5.1.1 No') ->> 'stage',
    'rcpt', 'the owner''s key sets its inbox''s fault');
SELECT throws_ok(format($$SELECT mailroom.http_set_inbox_fault(%L, %L, null, 'helo', '451 4.3.0 x')$$,
    pg_temp.a(), pg_temp.t()), 'MR230', NULL, 'a bad stage: MR230');
SELECT ok(mailroom.http_clear_inbox_fault(pg_temp.a(), pg_temp.t(), null), 'http_clear_inbox_fault');
SELECT ok(NOT mailroom.http_clear_inbox_fault(pg_temp.a(), pg_temp.t(), null), 'cleared already: false');

CREATE TEMP TABLE m AS SELECT mailroom.deliver_message(
    pg_temp.a(), convert_to(E'From: App <app@example.org>\r\nSubject: Hi\r\nX-Folded: one\r\n two\r\n\r\nbody', 'UTF8'),
    'app@example.org', '{"subject": "Hi", "from_header": "App <app@example.org>", "reply_to": "Help <help@example.org>",
      "text_body": "Go to https://app.example.org/a?t=1 code 48213", "html_body": "<p>x</p>",
      "attachments": [{"filename": "a.txt", "content_type": "text/plain", "size": 1, "sha256": "00"}]}'::jsonb
) AS id;
SELECT is(
    (SELECT jsonb_path_query_array(mailroom.http_list_messages(pg_temp.a(), pg_temp.t(), null), '$[*].subject')),
    '["Hi"]'::jsonb, 'the list: a JSON array'
);
SELECT is(
    (SELECT d - 'id' - 'received_at' - 'to_address' FROM jsonb_array_elements(
        mailroom.http_list_messages(pg_temp.a(), pg_temp.t(), null)) AS e (d)),
    '{"subject": "Hi", "from_address": "app@example.org", "is_read": false, "has_attachments": true,
      "from": "App <app@example.org>", "envelope_from": "app@example.org", "size": 69, "attachment_count": 1,
      "reply_to": "Help <help@example.org>", "snippet": "Go to https://app.example.org/a?t=1 code 48213", "tags": []}'::jsonb,
    'a summary: the original service''s keys and mailroom''s'
);
SELECT is(
    (SELECT jsonb_build_array(d -> 'headers' -> 2, d ->> 'link', d ->> 'code', d -> 'attachments' -> 0 ->> 'index',
                              d ->> 'body_text', d ->> 'body_html', d ->> 'from_address', d ->> 'is_read',
                              d ->> 'reply_to')
     FROM (SELECT mailroom.http_read_message(pg_temp.a(), pg_temp.t(), null, (SELECT id FROM m)) AS d) AS r),
    '[["X-Folded", "one two"], "https://app.example.org/a?t=1", "48213", "0",
      "Go to https://app.example.org/a?t=1 code 48213", "<p>x</p>", "app@example.org", "true",
      "Help <help@example.org>"]'::jsonb,
    'a message: unfolded headers, the link, the code, numbered attachments, body_text and body_html, read, reply_to'
);
SELECT is(
    (SELECT d -> 0 ->> 'is_read' FROM (SELECT mailroom.http_list_messages(pg_temp.a(), pg_temp.t(), null) AS d) AS r),
    'true', 'reading it marked it read'
);
SELECT is(
    (SELECT jsonb_build_array(v -> 'mailbox' ->> 'address', jsonb_array_length(v -> 'messages'))
     FROM (SELECT mailroom.http_mailbox_view(pg_temp.a(), pg_temp.t(), null) AS v) AS r),
    jsonb_build_array(pg_temp.a(), 1), 'the page''s view: the mailbox and its messages in one call'
);
SELECT is(
    (SELECT attachment ->> 'filename' FROM mailroom.http_message_attachment(pg_temp.a(), pg_temp.t(), null, (SELECT id FROM m), 0)),
    'a.txt', 'attachment 0''s metadata'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_attachment(%L, %L, null, %s, 1)$$, pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR250', NULL, 'no attachment 1: MR250'
);
SELECT is(
    (SELECT jsonb_build_array(d ->> 'subject', d ->> 'from_address', d ->> 'snippet')
     FROM (SELECT mailroom.http_check_message(pg_temp.a(), pg_temp.t(), null, 'H%') AS d) AS r),
    '["Hi", "app@example.org", "Go to https://app.example.org/a?t=1 code 48213"]'::jsonb,
    'a one-look wait finds it, as a summary'
);
SELECT is(mailroom.http_check_message(pg_temp.a(), pg_temp.t(), null, 'Bye%'), null, 'or answers NULL at once');
-- http_wait_look: the one wait's look (REST and MCP), with the inbox's id, its expiry and the cursor
SELECT is(
    (SELECT jsonb_build_array(d -> 'message' ->> 'subject', d ->> 'expires_in', d ->> 'expires_at')
     FROM (SELECT mailroom.http_wait_look(pg_temp.a(), pg_temp.t(), null, 'H%') AS d) AS r),
    jsonb_build_array('Hi', '300', mailroom.http_get_mailbox(pg_temp.a(), pg_temp.t(), null) ->> 'expires_at'),
    'http_wait_look: the message, and the seconds until the inbox expires by mailroom.clock()'
);
SELECT is(
    mailroom.http_wait_look(pg_temp.a(), pg_temp.t(), null, p_after_id => (SELECT id FROM m)) -> 'message',
    'null'::jsonb,
    'after the cursor: nothing yet (never the previous message)'
);
SELECT is(
    (mailroom.http_wait_look(pg_temp.a(), pg_temp.t(), null) ->> 'mailbox_id')::bigint,
    (mailroom.http_get_mailbox(pg_temp.a(), pg_temp.t(), null) ->> 'mailbox_id')::bigint,
    'the inbox''s id, the key LISTEN wakes waiters by'
);
SELECT throws_ok(
    format($$SELECT mailroom.http_wait_look(%L, %L, null, p_after_id => %s, p_last => true)$$,
           pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR212', NULL, 'the last look with nothing after the cursor: MR212'
);
SELECT throws_ok(format($$SELECT mailroom.http_wait_look(%L, null, null)$$, pg_temp.a()), 'MR240', NULL,
    'no credentials: MR240');
SELECT is(mailroom.http_check_message(pg_temp.a(), pg_temp.t(), null, 'Bye%', false), null,
    'the 0.1 look (deprecated) answers SQL NULL when none, as it did');
SELECT lives_ok(format($$SELECT mailroom.http_delete_message(%L, %L, null, %s)$$, pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'delete a message');
SELECT is(mailroom.http_get_mailbox(pg_temp.a(), pg_temp.t(), null) ->> 'message_count', '0', 'its place is free again');
SELECT throws_ok(format($$SELECT mailroom.http_delete_message(%L, %L, null, %s)$$, pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR209', NULL, 'twice: MR209');

-- an API key's inbox list: its owner's open inboxes of owner types api and mcp, newest first
SET LOCAL mailroom.clock = '2030-01-01 00:01:00+00';
CREATE TEMP TABLE mc AS SELECT c.* FROM mailroom.create_mailbox(10, 'free', 'mcp', 'team-1') AS c;
CREATE FUNCTION pg_temp.ma() RETURNS text LANGUAGE sql AS $$ SELECT address FROM mc $$;
SELECT mailroom.create_mailbox(10, 'free', 'mcp', 'team-2');
SELECT is(
    (SELECT jsonb_path_query_array(mailroom.http_list_mailboxes(sha256('mrk_one'::bytea)), '$[*].address')),
    jsonb_build_array(pg_temp.ma(), pg_temp.oa()), 'the list: the key owner''s mcp and api inboxes, newest first'
);
SELECT is(
    (SELECT jsonb_path_query_array(mailroom.http_list_mailboxes(sha256('mrk_one'::bytea), 1, 1), '$[*].owner_type')),
    '["api"]'::jsonb, 'paged'
);
SELECT throws_ok($$SELECT mailroom.http_list_mailboxes(null)$$, 'MR240', NULL, 'the list without a key: MR240');
-- the sink's open listing (the face's --sink on loopback): the sink's inboxes, no key needed
SELECT is((SELECT verdict FROM mailroom.check_bounce_recipient('dev@anything.example', p_sink => true)), 'ok', 'a sink inbox');
SELECT is(
    (SELECT jsonb_path_query_array(mailroom.http_list_mailboxes(null, p_sink => true), '$[*].address')),
    '["dev@anything.example"]'::jsonb, 'the sink listing without a key: the sink''s inboxes only'
);
SELECT is(
    (SELECT mailroom.http_get_mailbox('dev@anything.example', mailroom.http_list_mailboxes(null, p_sink => true) -> 0 ->> 'session_token', null) ->> 'plan'),
    'sink', 'each with the session token that opens it'
);
SELECT throws_ok(
    format($$SELECT mailroom.http_set_inbox_fault('dev@anything.example', %L, null, 'rcpt', '550 5.1.1 no')$$,
           mailroom.http_list_mailboxes(null, p_sink => true) -> 0 ->> 'session_token'),
    'MR295', NULL, 'a sink inbox takes no fault through its token: MR295'
);
SELECT lives_ok($$SELECT mailroom.set_setting('release.senders', 'some-relay')$$, 'release on');
SELECT throws_ok(
    format($$SELECT mailroom.http_release_message('dev@anything.example', %L, null, 1, 'qa@corp.example')$$,
           mailroom.http_list_mailboxes(null, p_sink => true) -> 0 ->> 'session_token'),
    'MR397', NULL, 'nor a release: an anonymous inbox, and a catch-all one (MR397)'
);
SELECT lives_ok($$SELECT mailroom.set_setting('release.senders', '')$$, 'release off again');
SELECT is(
    (SELECT jsonb_path_query_array(mailroom.http_list_mailboxes(sha256('mrk_one'::bytea), p_sink => true), '$[*].address'))
    @> '["dev@anything.example"]'::jsonb,
    false, 'with a key, the key''s own inboxes as before'
);
SELECT throws_ok(format($$SELECT mailroom.http_list_mailboxes(sha256(%L::bytea))$$, pg_temp.t()), 'MR241', NULL,
    'a session token lists nothing: MR241');
SELECT throws_ok($$SELECT mailroom.http_list_mailboxes(sha256('mrk_one'::bytea), 0)$$, '22023', NULL, 'a bad limit: 22023');
SELECT is(mailroom.http_get_mailbox(pg_temp.ma(), null, sha256('mrk_one'::bytea)) ->> 'owner_type', 'mcp',
    'an mcp inbox is read over REST with its owner''s key');
SELECT throws_ok(format($$SELECT mailroom.http_get_mailbox(%L, null, sha256('mrk_two'::bytea))$$, pg_temp.ma()),
    'MR204', NULL, 'not with another owner''s key');
SELECT is(mailroom.http_delete_mailbox(pg_temp.ma(), null, sha256('mrk_one'::bytea)), true, 'and deleted with it');
SELECT is(
    (SELECT jsonb_path_query_array(mailroom.http_list_mailboxes(sha256('mrk_one'::bytea)), '$[*].address')),
    jsonb_build_array(pg_temp.oa()), 'a deleted inbox leaves the list'
);

-- issue 35 item 1: tags (plus-addressing and PATCH), list filters, marks, deletes, extend, all mail
CREATE TEMP TABLE pm (k text, id bigint);
INSERT INTO pm SELECT 'plain', mailroom.deliver_message(pg_temp.oa(), '\x31'::bytea, 'a@example.org', 'Plain');
INSERT INTO pm SELECT 'news', mailroom.deliver_message(replace(pg_temp.oa(), '@', '+News@'), '\x32'::bytea, 'b@example.org', 'News');
INSERT INTO pm SELECT 'anon', mailroom.deliver_message(pg_temp.a(), '\x33'::bytea, 'c@example.org', 'Anon');
CREATE FUNCTION pg_temp.pm(text) RETURNS bigint LANGUAGE sql AS $$ SELECT id FROM pm WHERE k = $1 $$;
SELECT is(
    mailroom.http_list_messages(pg_temp.oa(), null, sha256('mrk_one'::bytea), p_tag => 'news') -> 0 -> 'tags',
    '["news"]'::jsonb, '?tag=: the plus-addressed message, with its tags in the summary'
);
SELECT is(
    mailroom.http_update_message(pg_temp.oa(), null, sha256('mrk_one'::bytea), pg_temp.pm('plain'), true, ARRAY['b', 'A'])
        - ARRAY['received_at', 'id', 'to_address', 'from', 'envelope_from', 'size', 'snippet', 'attachment_count',
                'has_attachments', 'from_address', 'reply_to'],
    '{"subject": "Plain", "is_read": true, "tags": ["a", "b"]}'::jsonb, 'PATCH: read, tags replaced (sorted, lower case)'
);
SELECT is(
    (SELECT jsonb_path_query_array(
        mailroom.http_list_messages(pg_temp.oa(), null, sha256('mrk_one'::bytea), p_unread => true), '$[*].subject')),
    '["News"]'::jsonb, '?unread=true: the unread only'
);
SELECT is(
    (SELECT jsonb_path_query_array(
        mailroom.http_list_messages(pg_temp.oa(), null, sha256('mrk_one'::bytea), p_unread => false), '$[*].subject')),
    '["Plain"]'::jsonb, '?unread=false: the read only'
);
SELECT throws_ok(
    format($$SELECT mailroom.http_update_message(%L, null, sha256('mrk_one'::bytea), %s, null, ARRAY['a b'])$$,
        pg_temp.oa(), pg_temp.pm('plain')), 'MR260', NULL, 'PATCH a bad tag: MR260'
);
SELECT is(
    (SELECT jsonb_path_query_array(mailroom.http_list_all_messages(null, sha256('mrk_one'::bytea)), '$[*].subject')),
    '["News", "Plain"]'::jsonb, 'all mail: the key owner''s messages, newest first (not the anonymous inbox''s)'
);
SELECT is(
    mailroom.http_list_all_messages(null, sha256('mrk_one'::bytea), 1, pg_temp.pm('news')) -> 0 -> 'mailbox',
    to_jsonb(pg_temp.oa()), 'all mail: keyset by id (before_id), each with its inbox'
);
SELECT is(
    jsonb_array_length(mailroom.http_list_all_messages(null, sha256('mrk_one'::bytea), p_tag => 'a', p_unread => false)), 1,
    'all mail: ?tag= and ?unread= filters'
);
SELECT throws_ok(format($$SELECT mailroom.http_list_all_messages(%L, null)$$, pg_temp.t()), 'MR263', NULL,
    'all mail with a session token: MR263');
SELECT throws_ok($$SELECT mailroom.http_list_all_messages(null, null)$$, 'MR240', NULL, 'all mail without credentials: MR240');
SELECT throws_ok($$SELECT mailroom.http_list_all_messages(null, sha256('mrk_one'::bytea), 201)$$, '22023', NULL,
    'all mail: limit over 200: 22023');
SELECT is(
    mailroom.http_extend_mailbox(pg_temp.oa(), null, sha256('mrk_one'::bytea), 999999) - ARRAY[
        'address', 'plan', 'owner_type', 'created_at', 'message_count', 'catchall', 'max_messages', 'max_message_bytes',
        'mailbox_id', 'is_active', 'fault'],
    jsonb_build_object('expires_at', '2030-01-02T00:01:00+00:00', 'max_ttl_seconds', 86400),
    'extend: now + ttl, clamped to the plan''s max TTL (pro: a day)'
);
SELECT is(
    mailroom.http_extend_mailbox(pg_temp.oa(), null, sha256('mrk_one'::bytea), 60) ->> 'expires_at',
    '2030-01-02T00:01:00+00:00', 'extend never shortens'
);
SELECT throws_ok(format($$SELECT mailroom.http_extend_mailbox(%L, %L, null, 0)$$, pg_temp.a(), pg_temp.t()), 'MR202', NULL,
    'extend by 0 seconds: MR202');
SELECT is(
    mailroom.http_delete_messages(pg_temp.oa(), null, sha256('mrk_one'::bytea), ARRAY[pg_temp.pm('plain'), pg_temp.pm('anon')]),
    '{"deleted": 1}'::jsonb, 'delete selected: only the inbox''s own are counted'
);
SELECT is(
    mailroom.http_clear_messages(pg_temp.oa(), null, sha256('mrk_one'::bytea)), '{"deleted": 1}'::jsonb,
    'delete all: the rest'
);
SELECT is((SELECT message_count FROM mailroom.mailboxes WHERE address = pg_temp.oa()), 0, 'the count back to 0');

SET LOCAL mailroom.clock = '2030-01-01 00:06:00+00';
SELECT throws_ok(format($$SELECT mailroom.http_list_messages(%L, %L, null)$$, pg_temp.a(), pg_temp.t()), 'MR205', NULL,
    'an expired inbox: MR205');

SELECT mailroom.set_setting('http.create_limit', '2');
SELECT mailroom.http_create_mailbox(null, '198.51.100.7');
SELECT mailroom.http_create_mailbox(null, '198.51.100.7');
SELECT throws_ok($$SELECT mailroom.http_create_mailbox(null, '198.51.100.7')$$, 'MR243', NULL,
    'a third creation from one address in the window: MR243');
SELECT is((SELECT count(*)::int FROM mailroom.http_rate_limits WHERE subject = convert_to('198.51.100.7', 'UTF8')), 0,
    'the client address is not stored as such');

-- the frame's HTML (issue 44 item 3): the HTML part, its inline images and the raw bytes to cut them from
CREATE TEMP TABLE f AS SELECT mailroom.deliver_message(
    pg_temp.oa(), convert_to(E'Subject: Logo\r\n\r\nbody', 'UTF8'), 'app@example.org',
    jsonb_build_object('subject', 'Logo', 'html_body', '<img src="cid:logo@x"><img src="cid:gone@x">',
        'attachments', jsonb_build_array(jsonb_build_object('content_type', 'image/png', 'size', 67,
            'content_id', 'logo@x', 'sha256', repeat('a', 64))))
) AS id;
SELECT is(
    (SELECT jsonb_build_array(html_body, inline_parts -> 0 ->> 'cid', jsonb_array_length(inline_parts), raw IS NOT NULL)
     FROM mailroom.http_message_frame(pg_temp.oa(), null, sha256('mrk_one'::bytea), (SELECT id FROM f))),
    '["<img src=\"cid:logo@x\"><img src=\"cid:gone@x\">", "logo@x", 1, true]'::jsonb,
    'the frame: the HTML part, its one inline image (the missing one left out) and the raw bytes'
);
SELECT is(
    (SELECT jsonb_build_array(inline_parts, raw IS NULL)
     FROM mailroom.http_message_frame(pg_temp.oa(), null, sha256('mrk_one'::bytea), mailroom.deliver_message(
         pg_temp.oa(), '\x34'::bytea, 'a@example.org', jsonb_build_object('html_body', '<p>no image</p>')))),
    '[[], true]'::jsonb, 'without inline images: no raw bytes'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_frame(%L, null, %L, %s)$$, pg_temp.oa(), sha256('mrk_two'::bytea),
           (SELECT id FROM f)),
    'MR204', NULL, 'the frame of another owner''s inbox: MR204'
);

-- operation mark_all_read (issue 43: the one added to prove the count of files, CONTRIBUTING.md)
CREATE TEMP TABLE ma AS SELECT mailroom.http_create_mailbox(sha256('mrk_43'::bytea), 'c') ->> 'address' AS address;
SELECT mailroom.deliver_message((SELECT address FROM ma), convert_to('Subject: s' || n || E'\r\n\r\nx', 'UTF8'),
    'a@example.org', jsonb_build_object('subject', 's' || n))
FROM generate_series(1, 3) AS n;
SELECT is(mailroom.http_mark_all_read((SELECT address FROM ma), null, sha256('mrk_43'::bytea)), '{"marked": 3}',
    'mark_all_read marks every unread message read');
SELECT is(mailroom.http_mark_all_read((SELECT address FROM ma), null, sha256('mrk_43'::bytea)), '{"marked": 0}',
    'and none twice');
SELECT is(mailroom.http_mark_all_read((SELECT address FROM ma), null, sha256('mrk_43'::bytea), false),
    '{"marked": 3}', 'is_read false: every one unread again');
SELECT throws_ok(
    $$SELECT mailroom.http_mark_all_read((SELECT address FROM ma), null, sha256('mrk_two'::bytea))$$, 'MR204', NULL,
    'another owner''s key: MR204'
);

-- Paging (issue 44 item 4): newest first by id, keyset before_id beside limit/offset. The clock runs
-- backwards as they arrive, so received_at orders them the other way round: the order is the ids'
-- (the order they were stored in), whatever received_at says.
SELECT mailroom.create_api_key('team-3', sha256('mrk_three'::bytea));
SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE pg AS SELECT mailroom.http_create_mailbox(sha256('mrk_three'::bytea), null, null, 'pro') AS doc;
CREATE FUNCTION pg_temp.pa() RETURNS text LANGUAGE sql AS $$ SELECT doc ->> 'address' FROM pg $$;
CREATE TEMP TABLE pgm (n integer, id bigint);
SET LOCAL mailroom.clock = '2030-01-01 00:10:00+00';
INSERT INTO pgm SELECT 1, mailroom.deliver_message(pg_temp.pa(), '\x31'::bytea, 'a@example.org',
    '{"subject": "paging paging one"}'::jsonb);
SET LOCAL mailroom.clock = '2030-01-01 00:09:00+00';
INSERT INTO pgm SELECT 2, mailroom.deliver_message(pg_temp.pa(), '\x32'::bytea, 'a@example.org', '{"subject": "paging two"}'::jsonb);
SET LOCAL mailroom.clock = '2030-01-01 00:08:00+00';
INSERT INTO pgm SELECT 3, mailroom.deliver_message(pg_temp.pa(), '\x33'::bytea, 'a@example.org', '{"subject": "paging three"}'::jsonb);
SET LOCAL mailroom.clock = '2030-01-01 00:07:00+00';
INSERT INTO pgm SELECT 4, mailroom.deliver_message(pg_temp.pa(), '\x34'::bytea, 'a@example.org', '{"subject": "paging four"}'::jsonb);
SET LOCAL mailroom.clock = '2030-01-01 00:06:00+00';
INSERT INTO pgm SELECT 5, mailroom.deliver_message(pg_temp.pa(), '\x35'::bytea, 'a@example.org', '{"subject": "paging five"}'::jsonb);
SET LOCAL mailroom.clock = '2030-01-01 00:11:00+00';
CREATE FUNCTION pg_temp.pid(p_n integer) RETURNS bigint LANGUAGE sql AS $$ SELECT id FROM pgm WHERE n = p_n $$;
CREATE FUNCTION pg_temp.subjects(p_doc jsonb) RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_path_query_array(p_doc, '$[*].subject')
$$;
SELECT is(
    pg_temp.subjects(mailroom.http_list_messages(pg_temp.pa(), null, sha256('mrk_three'::bytea), 2)),
    '["paging five", "paging four"]', 'the first page: the newest two by id (not by received_at)'
);
SELECT is(
    pg_temp.subjects(mailroom.http_list_messages(pg_temp.pa(), null, sha256('mrk_three'::bytea), 2,
        p_before_id => pg_temp.pid(4))),
    '["paging three", "paging two"]', 'before_id: the page before the previous page''s last message'
);
SELECT is(
    pg_temp.subjects(mailroom.http_list_messages(pg_temp.pa(), null, sha256('mrk_three'::bytea), 2,
        p_before_id => pg_temp.pid(2))),
    '["paging paging one"]', 'the last page: the oldest message'
);
SELECT is(
    pg_temp.subjects(mailroom.http_list_messages(pg_temp.pa(), null, sha256('mrk_three'::bytea), 2, 1)),
    '["paging four", "paging three"]', 'limit/offset still pages, in the same order (a bare JSON array)'
);
SELECT mailroom.http_delete_message(pg_temp.pa(), null, sha256('mrk_three'::bytea), pg_temp.pid(3));
SELECT is(
    pg_temp.subjects(mailroom.http_list_messages(pg_temp.pa(), null, sha256('mrk_three'::bytea), 2,
        p_before_id => pg_temp.pid(3))),
    '["paging two", "paging paging one"]', 'a cursor that was deleted still pages (ids, not rows)'
);
SELECT is(
    pg_temp.subjects(mailroom.http_mailbox_view(pg_temp.pa(), null, sha256('mrk_three'::bytea), 1,
        p_before_id => pg_temp.pid(4)) -> 'messages'),
    '["paging two"]', 'the page''s view pages by before_id too'
);
-- search: best first ("paging paging one" ranks above the rest), then newest by id; the next page is
-- what ranks after the previous page's last message
SELECT is(
    pg_temp.subjects(mailroom.http_search_messages(pg_temp.pa(), null, sha256('mrk_three'::bytea), 'paging', 2)
        -> 'messages'),
    '["paging paging one", "paging five"]', 'search: the best match, then the newest'
);
SELECT is(
    pg_temp.subjects(mailroom.http_search_messages(pg_temp.pa(), null, sha256('mrk_three'::bytea), 'paging', 2,
        pg_temp.pid(5)) -> 'messages'),
    '["paging four", "paging two"]', 'search, before_id: the matches ranked after the previous page''s last'
);
SELECT is(
    pg_temp.subjects(mailroom.http_search_messages(pg_temp.pa(), null, sha256('mrk_three'::bytea), 'paging', 2,
        pg_temp.pid(1)) -> 'messages'),
    '["paging five", "paging four"]', 'search, before the best match: the rest from the top'
);
SELECT throws_ok(
    format($$SELECT mailroom.http_search_messages(%L, null, %L, 'paging', 2, %s)$$,
        pg_temp.pa(), sha256('mrk_three'::bytea), pg_temp.pid(3)),
    'MR218', NULL, 'search before a message that is gone: MR218, start again'
);
-- /mail's search box: the owner's mail matching a query, newest first by id, the same keyset
SELECT is(
    pg_temp.subjects(mailroom.http_list_all_messages(null, sha256('mrk_three'::bytea), 2, p_query => 'paging')),
    '["paging five", "paging four"]', 'all mail searched: newest first by id'
);
SELECT is(
    pg_temp.subjects(mailroom.http_list_all_messages(null, sha256('mrk_three'::bytea), 2, pg_temp.pid(4),
        p_query => 'paging')),
    '["paging two", "paging paging one"]', 'all mail searched, before_id: the next page'
);
SELECT is(
    (mailroom.http_list_all_messages(null, sha256('mrk_three'::bytea), 1, p_query => 'two') -> 0 ->> 'mailbox'),
    pg_temp.pa(), 'each match names its inbox'
);
SELECT throws_ok(
    $$SELECT mailroom.http_list_all_messages(null, sha256('mrk_three'::bytea), 2, p_tag => 'a', p_query => 'paging')$$,
    '22023', NULL, 'q beside tag: 22023 (tag:x goes in the query)'
);

-- the message answer's helpers are inlined into their caller's query (no SET of their own; issue 46):
-- the plan shows their expressions, never a call
CREATE FUNCTION pg_temp.plan_of(p_query text) RETURNS text LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp  -- as inside the API functions that call them
AS $$
DECLARE
    v_line text;
    v_plan text := '';
BEGIN
    FOR v_line IN EXECUTE 'EXPLAIN (VERBOSE) ' || p_query LOOP
        v_plan := v_plan || v_line || E'\n';
    END LOOP;
    RETURN v_plan;
END;
$$;
SELECT doesnt_match(
    pg_temp.plan_of('SELECT mailroom_internal._http_message_summary(g) FROM mailroom.messages AS g LIMIT 1'),
    '_http_message_summary|_http_message_json|_from_address',
    'the message helpers are inlined into the list''s query'
);

SELECT * FROM finish();
ROLLBACK;
