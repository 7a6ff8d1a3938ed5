-- The MCP face's functions: inboxes owned by (mcp, the key's owner), read by that key together with
-- the owner's api inboxes and by no other key (MR204); no key MR240, a bad key MR241; the REST
-- creation limit shared with REST (MR243); the JSON of reads, one-look waits (MR212 on the last),
-- link and code, deletion (MR206 after it).
BEGIN;
SELECT plan(37);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
SELECT mailroom.create_api_key('agent-1', sha256('mrk_one'::bytea));
SELECT mailroom.create_api_key('agent-2', sha256('mrk_two'::bytea));
CREATE TEMP TABLE b AS SELECT mailroom.mcp_create_mailbox(sha256('mrk_one'::bytea), 5) AS doc;
CREATE TEMP TABLE r AS SELECT mailroom.http_create_mailbox(sha256('mrk_one'::bytea), null) AS doc;
CREATE FUNCTION pg_temp.a() RETURNS text LANGUAGE sql AS $$ SELECT doc ->> 'address' FROM b $$;
CREATE FUNCTION pg_temp.k() RETURNS bytea LANGUAGE sql AS $$ SELECT sha256('mrk_one'::bytea) $$;

SELECT is(
    (SELECT row(doc ->> 'plan', doc ->> 'owner_type', doc ->> 'expires_at', doc ? 'session_token')::text FROM b),
    '(free,mcp,2030-01-01T00:05:00+00:00,f)', 'created: owner type mcp, the TTL asked for, no session token'
);
SELECT is(
    (SELECT row(m.owner_type, m.owner_id)::text FROM mailroom.mailboxes AS m WHERE m.address = pg_temp.a()),
    '(mcp,agent-1)', 'owned by the key''s owner'
);
SELECT throws_ok($$SELECT mailroom.mcp_create_mailbox(null)$$, 'MR240', NULL, 'no key: MR240');
SELECT throws_ok($$SELECT mailroom.mcp_create_mailbox(sha256('mrk_x'::bytea))$$, 'MR241', NULL, 'an unknown key: MR241');
SELECT throws_ok($$SELECT mailroom.mcp_create_mailbox(sha256('mrk_one'::bytea), 5, 'nope')$$, 'MR201', NULL,
    'an unknown plan: MR201');
SELECT is(
    (SELECT jsonb_agg(e ->> 'owner_type' ORDER BY e ->> 'owner_type')
     FROM jsonb_array_elements(mailroom.mcp_list_mailboxes(pg_temp.k())) AS e),
    '["api", "mcp"]'::jsonb, 'the key lists its owner''s api and mcp inboxes'
);
SELECT is(mailroom.mcp_list_mailboxes(sha256('mrk_two'::bytea)), '[]'::jsonb, 'another owner''s key lists none of them');
SELECT throws_ok(format($$SELECT mailroom.mcp_list_messages(%L, sha256('mrk_two'::bytea))$$, pg_temp.a()), 'MR204', NULL,
    'another owner''s key cannot read it: MR204');
SELECT throws_ok($$SELECT mailroom.mcp_list_messages('nobody@mailroom.test', sha256('mrk_one'::bytea))$$, 'MR203', NULL,
    'no such inbox: MR203');
SELECT is(
    mailroom.mcp_list_messages((SELECT doc ->> 'address' FROM r), pg_temp.k()) -> 'mailbox' ->> 'owner_type', 'api',
    'the key reads its owner''s REST (api) inbox too'
);
SELECT is(
    (SELECT doc FROM (SELECT mailroom.mcp_check_message(pg_temp.a(), pg_temp.k()) AS doc) AS c) -> 'message',
    'null'::jsonb, 'a look before any mail: no message'
);
SELECT is(
    (mailroom.mcp_check_message(pg_temp.a(), pg_temp.k()) ->> 'mailbox_id')::bigint,
    (SELECT m.id FROM mailroom.mailboxes AS m WHERE m.address = pg_temp.a()), 'with the inbox id to wait on'
);
SELECT throws_ok(format($$SELECT mailroom.mcp_check_message(%L, sha256('mrk_one'::bytea), null, true)$$, pg_temp.a()),
    'MR212', NULL, 'the last look without a message: MR212');

CREATE TEMP TABLE m AS SELECT mailroom.deliver_message(
    pg_temp.a(), convert_to(E'From: App <app@example.org>\r\nSubject: Activate\r\n\r\nbody', 'UTF8'),
    'app@example.org', 'Activate', 'App <app@example.org>', 'Go to https://app.example.org/activate?t=1 code 48213',
    null, '[]'
) AS id;
SELECT is(mailroom.mcp_check_message(pg_temp.a(), pg_temp.k(), 'Activ%', true) -> 'message' ->> 'id',
    (SELECT id::text FROM m), 'a look finds it');
SELECT is(
    jsonb_path_query_array(mailroom.mcp_list_messages(pg_temp.a(), pg_temp.k()), '$.messages[*].subject'),
    '["Activate"]'::jsonb, 'the list'
);
SELECT is(
    (SELECT jsonb_build_array(d ->> 'subject', d ->> 'link', d ->> 'code', d -> 'is_read')
     FROM (SELECT mailroom.mcp_read_message(pg_temp.a(), pg_temp.k(), (SELECT id FROM m)) AS d) AS x),
    '["Activate", "https://app.example.org/activate?t=1", "48213", true]'::jsonb,
    'a message: its link and code, marked read'
);
-- one document with the HTTP API's (reply_to, from_address, body_text …), and MCP's first keys beside it
SELECT is(
    mailroom.mcp_read_message(pg_temp.a(), pg_temp.k(), (SELECT id FROM m)) - ARRAY['to', 'text', 'html'],
    mailroom.http_read_message(pg_temp.a(), null, pg_temp.k(), (SELECT id FROM m)),
    'read_message: the HTTP API''s Message document'
);
SELECT is(
    (SELECT jsonb_build_array(d ? 'reply_to', d ->> 'to' = d ->> 'to_address', d ->> 'text' = d ->> 'body_text')
     FROM (SELECT mailroom.mcp_read_message(pg_temp.a(), pg_temp.k(), (SELECT id FROM m)) AS d) AS x),
    '[true, true, true]'::jsonb,
    'read_message: reply_to, and to and text as before'
);
SELECT throws_ok(format($$SELECT mailroom.mcp_read_message(%L, sha256('mrk_one'::bytea), -1)$$, pg_temp.a()),
    'MR209', NULL, 'no such message: MR209');
SELECT is(mailroom.mcp_extract_link(pg_temp.a(), pg_temp.k(), (SELECT id FROM m), '%activate%'),
    'https://app.example.org/activate?t=1', 'extract_link');
SELECT is(mailroom.mcp_extract_code(pg_temp.a(), pg_temp.k(), (SELECT id FROM m)), '48213', 'extract_code');
SELECT throws_ok(
    format($$SELECT mailroom.mcp_extract_code(%L, sha256('mrk_one'::bytea), %s, '\m\d{9}\M')$$, pg_temp.a(), (SELECT id FROM m)),
    'MR215', NULL, 'no code of that pattern: MR215'
);
-- fault injection (issue 35) and the one owner rule (issue 36): the MCP face's MR240 words, the rule's MR204
SELECT is((mailroom.mcp_set_inbox_fault(pg_temp.a(), pg_temp.k(), 'data', '554 5.7.1 Policy', 50) ->> 'share')::numeric, 50.0,
    'mcp_set_inbox_fault');
SELECT is(mailroom.mcp_list_messages(pg_temp.a(), pg_temp.k()) -> 'mailbox' -> 'fault' ->> 'reply', '554 5.7.1 Policy',
    'the inbox''s JSON shows the fault');
SELECT throws_ok(format($$SELECT mailroom.mcp_set_inbox_fault(%L, sha256('mrk_two'::bytea), 'rcpt', '451 4.3.0 x')$$,
    pg_temp.a()), 'MR204', NULL, 'another owner''s key cannot set it: MR204');
SELECT throws_ok(format($$SELECT mailroom.mcp_clear_inbox_fault(%L, null)$$, pg_temp.a()), 'MR240',
    'credentials required: an API key', 'no key: MR240 in the MCP face''s words');
SELECT ok(mailroom.mcp_clear_inbox_fault(pg_temp.a(), pg_temp.k()), 'mcp_clear_inbox_fault');
SELECT is(
    (SELECT array_agg(code ORDER BY code) FROM mailroom.mcp_error_codes() WHERE function_name = 'mcp_clear_inbox_fault'),
    ARRAY['MR203', 'MR204'], 'mcp_error_codes lists the fault tools'' codes'
);

-- what it changed (the summary's shape is MessageSummary's: tests/http/test_http_api.py)
SELECT is(
    (SELECT jsonb_build_object('subject', d -> 'subject', 'is_read', d -> 'is_read', 'tags', d -> 'tags')
     FROM mailroom.mcp_mark_message(pg_temp.a(), pg_temp.k(), (SELECT id FROM m), false, ARRAY['Signup']) AS d),
    '{"subject": "Activate", "is_read": false, "tags": ["signup"]}'::jsonb, 'mark_message: unread, tagged'
);
SELECT throws_ok(format($$SELECT mailroom.mcp_mark_message(%L, sha256('mrk_two'::bytea), %s, true)$$, pg_temp.a(),
    (SELECT id FROM m)), 'MR204', NULL, 'mark_message with another owner''s key: MR204');
SELECT is(mailroom.mcp_extend_mailbox(pg_temp.a(), pg_temp.k(), 600) ->> 'expires_at', '2030-01-01T00:10:00+00:00',
    'extend_inbox: now + the TTL');
SELECT is(mailroom.mcp_clear_messages(pg_temp.a(), pg_temp.k()), '{"deleted": 1}'::jsonb, 'clear_inbox: every message');
SELECT is(mailroom.mcp_delete_mailbox(pg_temp.a(), pg_temp.k()), true, 'delete the inbox');
SELECT throws_ok(format($$SELECT mailroom.mcp_list_messages(%L, sha256('mrk_one'::bytea))$$, pg_temp.a()), 'MR206', NULL,
    'a deleted inbox: MR206');

SELECT mailroom.set_setting('http.create_limit', '2');
SELECT throws_ok($$SELECT mailroom.mcp_create_mailbox(sha256('mrk_one'::bytea))$$, 'MR243', NULL,
    'the key''s third creation (one over REST, one over MCP before it) hits the shared limit: MR243');

SELECT is(
    (SELECT string_agg(code, ',') FROM mailroom.mcp_error_codes() WHERE function_name = 'mcp_check_message'),
    'MR212,MR205,MR206,MR251,MR252,MR253,MR011,MR203,MR204',
    'the codes of a tool, in the order its description names them (its http_* function''s Errors: list)'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.mcp_error_codes() WHERE meaning IS NULL OR meaning = ''), 0,
    'each with its meaning'
);

SELECT * FROM finish();
ROLLBACK;
