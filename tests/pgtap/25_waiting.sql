-- Waiting for mail from SQL: wait_for_message (newest match, subject filter, timeout, bad
-- timeouts, authorization), extract_link (text part, HTML hrefs, LIKE filter) and extract_code.
-- Waiting on a commit from another session is in tests/inboxes/test_inbox_watch.py.
BEGIN;
SELECT plan(47);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE b AS
SELECT 'anon' AS k, * FROM mailroom.create_mailbox(30, 'free');
INSERT INTO b SELECT 'owned', * FROM mailroom.create_mailbox(30, 'pro', 'api', 'client-1');
INSERT INTO b SELECT 'other', * FROM mailroom.create_mailbox(30, 'free');
INSERT INTO b SELECT 'empty', * FROM mailroom.create_mailbox(30, 'free');
CREATE FUNCTION pg_temp.addr(text) RETURNS text LANGUAGE sql AS $$ SELECT address FROM b WHERE k = $1 $$;
CREATE FUNCTION pg_temp.tok(text) RETURNS text LANGUAGE sql AS $$ SELECT session_token FROM b WHERE k = $1 $$;

CREATE TEMP TABLE g (k text, id bigint);
SET LOCAL mailroom.clock = '2030-01-01 00:01:00+00';
INSERT INTO g SELECT 'welcome', mailroom.deliver_message(
    pg_temp.addr('anon'), '\x31'::bytea, 'app@example.org', 'Welcome to Example', 'App <app@example.org>',
    E'Hello,\r\nactivate your account: https://app.example.org/activate?t=abc-123_x.\r\n'
    || E'Help: https://app.example.org/help, or code 48213.\r\n',
    '<p>ignored when the text part has one</p>'
);
SET LOCAL mailroom.clock = '2030-01-01 00:02:00+00';
INSERT INTO g SELECT 'html', mailroom.deliver_message(
    pg_temp.addr('anon'), '\x32'::bytea, 'app@example.org', 'Your code', 'App <app@example.org>',
    null,
    '<html><head><style>.c{color:#12345}</style></head><body>'
    || '<a href="mailto:help@example.org">help</a> '
    || '<a class="b" href = "https://app.example.org/reset?a=1&amp;t=zz9">Reset</a> '
    || '<a href=''https://app.example.org/unsubscribe''>x</a>'
    || '<p>Your code: <b>90210</b></p></body></html>'
);
INSERT INTO g SELECT 'bare', mailroom.deliver_message(
    pg_temp.addr('other'), '\x33'::bytea, 'x@example.org', 'Nothing', null, 'no links, no digits', null
);
INSERT INTO g SELECT 'owned', mailroom.deliver_message(
    pg_temp.addr('owned'), '\x34'::bytea, 'x@example.org', 'Owned', null, 'https://o.example.org/ 11111', null
);
CREATE FUNCTION pg_temp.mid(text) RETURNS bigint LANGUAGE sql AS $$ SELECT id FROM g WHERE k = $1 $$;
SET LOCAL mailroom.clock = '2030-01-01 00:05:00+00';

-- wait_for_message: a message already there comes back at once, the newest first
SELECT is(
    (SELECT message_id FROM mailroom.wait_for_message(pg_temp.addr('anon'), pg_temp.tok('anon'), '5 seconds')),
    pg_temp.mid('html'),
    'the newest message of the inbox'
);
SELECT results_eq(
    format(
        $$SELECT message_id, received_at, subject, from_header, envelope_from
          FROM mailroom.wait_for_message(%L, %L, '5 seconds', 'Welcome%%')$$,
        pg_temp.addr('anon'), pg_temp.tok('anon')
    ),
    format(
        $$VALUES (%s::bigint, '2030-01-01 00:01:00+00'::timestamptz, 'Welcome to Example'::text,
                  'App <app@example.org>'::text, 'app@example.org'::text)$$,
        pg_temp.mid('welcome')
    ),
    'p_subject_like picks the newest message whose subject matches, with its fields'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.wait_for_message(pg_temp.addr('anon'), pg_temp.tok('anon'), '0 seconds')),
    1,
    'one row'
);
SELECT is(
    (SELECT message_id FROM mailroom.wait_for_message(pg_temp.addr('owned'), null, '0 s', null, 'api', 'client-1')),
    pg_temp.mid('owned'),
    'an api owner is authorized by owner type and id'
);
SELECT is(
    (SELECT is_read FROM mailroom.list_messages(pg_temp.addr('anon'), pg_temp.tok('anon')) LIMIT 1),
    false,
    'waiting does not mark the message read'
);

-- the timeout: counted in sleeps, so even a pinned clock cannot make it wait forever
SELECT throws_ok(
    format($$SELECT * FROM mailroom.wait_for_message(%L, %L, '0 seconds')$$, pg_temp.addr('empty'), pg_temp.tok('empty')),
    'MR212', 'no matching message arrived within 00:00:00',
    'nothing there and a zero timeout: MR212 at once'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.wait_for_message(%L, %L, '200 milliseconds', 'Nope%%')$$,
           pg_temp.addr('anon'), pg_temp.tok('anon')),
    'MR212', 'no matching message arrived within 00:00:00.2',
    'no subject matches within the timeout: MR212'
);
CREATE TEMP TABLE t0 AS SELECT clock_timestamp() AS t;
SELECT throws_ok(
    format($$SELECT * FROM mailroom.wait_for_message(%L, %L, '300 milliseconds')$$, pg_temp.addr('empty'), pg_temp.tok('empty')),
    'MR212', NULL, 'a pinned clock does not stop the wait from ending'
);
SELECT cmp_ok(
    clock_timestamp() - (SELECT t FROM t0), '>=', interval '300 milliseconds', 'it waited the whole timeout'
);
SELECT cmp_ok(
    clock_timestamp() - (SELECT t FROM t0), '<', interval '3 seconds', 'and not much longer'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.wait_for_message(%L, %L, '-1 second')$$, pg_temp.addr('anon'), pg_temp.tok('anon')),
    'MR213', 'p_timeout must be between 0 and 60 seconds (CALL mailroom.await_message waits up to 10 minutes)',
    'a negative timeout is refused'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.wait_for_message(%L, %L, '61 seconds')$$, pg_temp.addr('anon'), pg_temp.tok('anon')),
    'MR213', NULL, 'a timeout over 60 seconds is refused: the wait holds its snapshot and locks that long'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.wait_for_message(%L, %L, NULL)$$, pg_temp.addr('anon'), pg_temp.tok('anon')),
    'MR213', NULL, 'a NULL timeout is refused'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.wait_for_message(%L, %L, '1 second')$$, pg_temp.addr('anon'), pg_temp.tok('other')),
    'MR204', NULL, 'another inbox''s session token is refused'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.wait_for_message('nobody@mailroom.test', 'x', '1 second')$$,
    'MR203', NULL, 'an unknown inbox is MR203'
);

-- find_message: one poll, no wait
SELECT is(
    mailroom.find_message(pg_temp.addr('anon'), pg_temp.tok('anon')), pg_temp.mid('html'),
    'find_message: the newest message''s id'
);
SELECT is(
    mailroom.find_message(pg_temp.addr('anon'), pg_temp.tok('anon'), 'Welcome%'), pg_temp.mid('welcome'),
    'find_message: the newest whose subject matches'
);
SELECT is(mailroom.find_message(pg_temp.addr('empty'), pg_temp.tok('empty')), NULL, 'find_message: NULL when none');
SELECT throws_ok(
    format($$SELECT mailroom.find_message(%L, %L)$$, pg_temp.addr('anon'), pg_temp.tok('other')),
    'MR204', NULL, 'find_message: authorized like reading'
);

-- await_message: the CALL form (its commits between polls are tested in tests/inboxes/test_inbox_watch.py)
CREATE TEMP TABLE called AS SELECT null::bigint AS id;
DO $$
DECLARE
    v_address text := (SELECT address FROM b WHERE k = 'anon');
    v_token text := (SELECT session_token FROM b WHERE k = 'anon');
    v_id bigint;
BEGIN
    CALL mailroom.await_message(v_address, v_token, '5 seconds', 'Welcome%', null, null, v_id);
    UPDATE called SET id = v_id;
END;
$$;
SELECT is((SELECT id FROM called), pg_temp.mid('welcome'), 'await_message: a message already there, at once');
SELECT throws_ok(
    format($$CALL mailroom.await_message(%L, %L, '10 minutes 1 second')$$, pg_temp.addr('anon'), pg_temp.tok('anon')),
    'MR213', 'p_timeout must be between 0 and 10 minutes', 'await_message: up to 10 minutes'
);
SELECT throws_ok(
    format($$CALL mailroom.await_message(%L, %L, '1 second')$$, pg_temp.addr('empty'), pg_temp.tok('empty')),
    '2D000', NULL, 'await_message commits between polls, so a transaction block must use wait_for_message'
);

-- extract_link
SELECT is(
    mailroom.extract_link(pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('welcome')),
    'https://app.example.org/activate?t=abc-123_x',
    'the first link of the text part, without the sentence''s full stop'
);
SELECT is(
    mailroom.extract_link(pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('welcome'), '%/help%'),
    'https://app.example.org/help',
    'p_url_like picks the link, trailing comma dropped'
);
SELECT is(
    mailroom.extract_link(pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('html')),
    'https://app.example.org/reset?a=1&t=zz9',
    'no text part: the first http(s) href of the HTML part (mailto skipped, &amp; decoded)'
);
SELECT is(
    mailroom.extract_link(pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('html'), '%unsubscribe'),
    'https://app.example.org/unsubscribe',
    'single-quoted hrefs too'
);
SELECT is(
    mailroom.extract_link(pg_temp.addr('owned'), null, pg_temp.mid('owned'), null, 'api', 'client-1'),
    'https://o.example.org/',
    'an api owner may extract from its inbox'
);
SELECT throws_ok(
    format('SELECT mailroom.extract_link(%L, %L, %s, %L)', pg_temp.addr('anon'), pg_temp.tok('anon'),
           pg_temp.mid('welcome'), '%nowhere%'),
    'MR215', format('no link matching the pattern in message %s', pg_temp.mid('welcome')),
    'no link matches: MR215'
);
SELECT throws_ok(
    format('SELECT mailroom.extract_link(%L, %L, %s)', pg_temp.addr('other'), pg_temp.tok('other'), pg_temp.mid('bare')),
    'MR215', format('no link in message %s', pg_temp.mid('bare')),
    'a message without links: MR215'
);
SELECT throws_ok(
    format('SELECT mailroom.extract_link(%L, %L, %s)', pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('bare')),
    'MR209', NULL,
    'a message of another inbox is not found in this one (MR209)'
);
SELECT throws_ok(
    format('SELECT mailroom.extract_link(%L, %L, %s)', pg_temp.addr('other'), pg_temp.tok('anon'), pg_temp.mid('bare')),
    'MR204', NULL,
    'the message id alone opens nothing: the inbox''s token is required'
);

-- extract_code
SELECT is(
    mailroom.extract_code(pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('welcome')),
    '48213',
    'the default pattern: a 5-digit word, not digits inside the link'
);
SELECT is(
    mailroom.extract_code(pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('html')),
    '90210',
    'no text part: the visible text of the HTML (a style''s #12345 is not visible)'
);
SELECT is(
    mailroom.extract_code(pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('welcome'), 't=([a-z]+)-'),
    'abc',
    'a pattern with a group returns the group'
);
SELECT throws_ok(
    format('SELECT mailroom.extract_code(%L, %L, %s)', pg_temp.addr('other'), pg_temp.tok('other'), pg_temp.mid('bare')),
    'MR215', format('no code matching the pattern in message %s', pg_temp.mid('bare')),
    'no code: MR215'
);
SELECT throws_ok(
    format('SELECT mailroom.extract_code(%L, %L, %s, %L)', pg_temp.addr('other'), pg_temp.tok('other'),
           pg_temp.mid('bare'), ''),
    '22023', NULL,
    'an empty pattern is refused'
);

-- the cursor (issue 43): only a message with a greater id answers, so a resend flow waits for the next
SELECT is(
    (SELECT message_id FROM mailroom.wait_for_message(
        pg_temp.addr('anon'), pg_temp.tok('anon'), '0 s', p_after_id => pg_temp.mid('welcome'))),
    pg_temp.mid('html'),
    'p_after_id: the newest message after the cursor'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.wait_for_message(%L, %L, '100 milliseconds', p_after_id => %s)$$,
           pg_temp.addr('anon'), pg_temp.tok('anon'), pg_temp.mid('html')),
    'MR212', NULL,
    'nothing after the cursor: the wait runs to its timeout (MR212), it does not answer the previous message'
);
SELECT is(
    (SELECT message_id FROM mailroom.wait_for_message(
        pg_temp.addr('anon'), pg_temp.tok('anon'), '0 s', 'Welcome%', p_after_id => pg_temp.mid('welcome') - 1)),
    pg_temp.mid('welcome'),
    'the cursor and the subject filter together'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.wait_for_message(pg_temp.addr('anon'), pg_temp.tok('anon'), '0 s', null, null, null, null)),
    1,
    'p_after_id NULL: any message (the old call''s meaning)'
);
-- the caps of a server's waits are settings, and their refusals SQL's
SELECT results_eq(
    'SELECT kind, per_credential, total, per_client FROM mailroom.wait_caps() ORDER BY kind',
    $$VALUES ('events'::text, 500, 6000, 1000), ('wait'::text, 100, 2000, 200)$$,
    'wait_caps: the settings wait.* and events.*'
);
SELECT throws_ok($$SELECT mailroom.wait_refused('wait', 'credential')$$, 'MR251', NULL, 'over a credential''s cap: MR251');
SELECT throws_ok($$SELECT mailroom.wait_refused('events', 'total')$$, 'MR252', NULL, 'over the total: MR252');
SELECT throws_ok(
    $$SELECT mailroom.wait_refused('wait', 'client')$$,
    'MR253', 'too many waits from this client address on this server (wait.max_per_client), try again',
    'over a client address''s cap: MR253'
);
SELECT throws_ok($$SELECT mailroom.wait_refused('naps', 'total')$$, '22023', NULL, 'an unknown kind: 22023');

-- the inbox's state is checked as for reading
SELECT mailroom.delete_mailbox(pg_temp.addr('other'), pg_temp.tok('other')) AS deleted \gset
SELECT throws_ok(
    format('SELECT mailroom.extract_code(%L, %L, %s)', pg_temp.addr('other'), pg_temp.tok('other'), pg_temp.mid('bare')),
    'MR206', NULL,
    'a deleted inbox: MR206'
);
SET LOCAL mailroom.clock = '2030-01-01 01:00:00+00';
SELECT throws_ok(
    format($$SELECT * FROM mailroom.wait_for_message(%L, %L, '1 second')$$, pg_temp.addr('anon'), pg_temp.tok('anon')),
    'MR205', NULL,
    'an expired inbox: MR205, at once'
);

SELECT * FROM finish();
ROLLBACK;
