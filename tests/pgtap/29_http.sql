-- The HTTP API's functions: authorization by session token or API key owner (MR240/MR241/MR204),
-- anonymous plans (MR242), the creation rate limit (MR243), the JSON answers, an expired inbox
-- (MR205), deleting a message (its place is freed), attachments (MR250), one-look waits.
BEGIN;
SELECT plan(22);

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
SELECT mailroom.create_api_key('team-1', sha256('mrk_one'::bytea));
SELECT mailroom.create_api_key('team-2', sha256('mrk_two'::bytea));
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

CREATE TEMP TABLE m AS SELECT mailroom.deliver_message(
    pg_temp.a(), convert_to(E'From: App <app@example.org>\r\nSubject: Hi\r\nX-Folded: one\r\n two\r\n\r\nbody', 'UTF8'),
    'app@example.org', 'Hi', 'App <app@example.org>', 'Go to https://app.example.org/a?t=1 code 48213', '<p>x</p>',
    '[{"filename": "a.txt", "content_type": "text/plain", "size": 1, "sha256": "00"}]'
) AS id;
SELECT is(
    (SELECT jsonb_path_query_array(mailroom.http_list_messages(pg_temp.a(), pg_temp.t(), null), '$.messages[*].subject')),
    '["Hi"]'::jsonb, 'the list'
);
SELECT is(
    (SELECT jsonb_build_array(d -> 'headers' -> 2, d ->> 'link', d ->> 'code', d -> 'attachments' -> 0 ->> 'index')
     FROM (SELECT mailroom.http_read_message(pg_temp.a(), pg_temp.t(), null, (SELECT id FROM m)) AS d) AS r),
    '[["X-Folded", "one two"], "https://app.example.org/a?t=1", "48213", "0"]'::jsonb,
    'a message: unfolded headers, the link, the code, numbered attachments'
);
SELECT is(
    (SELECT attachment ->> 'filename' FROM mailroom.http_message_attachment(pg_temp.a(), pg_temp.t(), null, (SELECT id FROM m), 0)),
    'a.txt', 'attachment 0''s metadata'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_attachment(%L, %L, null, %s, 1)$$, pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR250', NULL, 'no attachment 1: MR250'
);
SELECT is(mailroom.http_check_message(pg_temp.a(), pg_temp.t(), null, 'H%') ->> 'subject', 'Hi', 'a one-look wait finds it');
SELECT is(mailroom.http_check_message(pg_temp.a(), pg_temp.t(), null, 'Bye%'), null, 'or answers NULL at once');
SELECT lives_ok(format($$SELECT mailroom.http_delete_message(%L, %L, null, %s)$$, pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'delete a message');
SELECT is(mailroom.http_get_mailbox(pg_temp.a(), pg_temp.t(), null) ->> 'message_count', '0', 'its place is free again');
SELECT throws_ok(format($$SELECT mailroom.http_delete_message(%L, %L, null, %s)$$, pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR209', NULL, 'twice: MR209');

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

SELECT * FROM finish();
ROLLBACK;
