-- The checks of a message (docs/checks.md): http_message_check authorizes as every http_* call,
-- returns only what each check reads, refuses a check the server does not run (MR280, MR281), the
-- HTML check of a message without HTML (MR282) and an unknown check (MR283), and never marks the
-- message read. The link check reads its ports too (setting checks.link_ports; MR284 when bad).
-- Each check takes one from the key's and the inbox's rates (checks.rate_per_key,
-- checks.rate_per_inbox; sql/09_rates.sql): over either, MR020.
BEGIN;
SELECT plan(22);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE j AS SELECT mailroom.http_create_mailbox(null, '192.0.2.1', 5) AS doc;
CREATE FUNCTION pg_temp.a() RETURNS text LANGUAGE sql AS $$ SELECT doc ->> 'address' FROM j $$;
CREATE FUNCTION pg_temp.t() RETURNS text LANGUAGE sql AS $$ SELECT doc ->> 'session_token' FROM j $$;
CREATE TEMP TABLE m AS SELECT mailroom.deliver_message(
    pg_temp.a(), convert_to(E'Subject: hi\r\n\r\nbody', 'UTF8'), 'a@example.org', 'hi', null, 'see https://example.org/x',
    '<p style="color:red">hi <a href="https://example.org/y">y</a></p>'
) AS id;
CREATE TEMP TABLE p AS SELECT mailroom.deliver_message(
    pg_temp.a(), convert_to(E'Subject: plain\r\n\r\nbody', 'UTF8'), 'a@example.org', 'plain', null, 'plain text'
) AS id;

SELECT is(
    (SELECT row(html_body IS NOT null, text_body IS null, raw IS null)::text
     FROM mailroom.http_message_check(pg_temp.a(), pg_temp.t(), null, (SELECT id FROM m), 'html')),
    '(t,t,t)', 'html: the HTML part only'
);
SELECT is(
    (SELECT row(html_body IS NOT null, text_body, raw IS null)::text
     FROM mailroom.http_message_check(pg_temp.a(), pg_temp.t(), null, (SELECT id FROM m), 'links', true)),
    '(t,"see https://example.org/x",t)', 'links: the HTML and text parts'
);
SELECT is(
    (SELECT row(html_body IS null, text_body IS null, convert_from(raw, 'UTF8'))::text
     FROM mailroom.http_message_check(pg_temp.a(), pg_temp.t(), null, (SELECT id FROM m), 'spam', true)),
    row(true, true, E'Subject: hi\r\n\r\nbody')::text, 'spam: the raw bytes as received'
);
SELECT is(
    (SELECT link_ports FROM mailroom.http_message_check(pg_temp.a(), pg_temp.t(), null, (SELECT id FROM m), 'links', true)),
    '{80,443}'::integer[], 'links: the ports it may ask, 80 and 443 by default'
);
SELECT is(
    (SELECT link_ports FROM mailroom.http_message_check(pg_temp.a(), pg_temp.t(), null, (SELECT id FROM m), 'html')),
    null, 'html: no ports'
);
SELECT mailroom.set_setting('checks.link_ports', ' 8080, 443,80 ,8080');
SELECT is(
    (SELECT link_ports FROM mailroom.http_message_check(pg_temp.a(), pg_temp.t(), null, (SELECT id FROM m), 'links', true)),
    '{80,443,8080}'::integer[], 'links: the ports of checks.link_ports, sorted, each once'
);
SELECT mailroom.set_setting('checks.link_ports', '80,70000');
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, %s, 'links', true)$$,
           pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR284', NULL, 'a port over 65535: MR284'
);
SELECT mailroom.set_setting('checks.link_ports', '80;443');
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, %s, 'links', true)$$,
           pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR284', NULL, 'not a comma-separated list: MR284'
);
SELECT mailroom.set_setting('checks.link_ports', '80,443');
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, %s, 'links', false)$$,
           pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR280', NULL, 'the link check off: MR280'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, %s, 'links', null)$$,
           pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR280', NULL, 'a switch not told is off: MR280'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, %s, 'spam', false)$$,
           pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR281', NULL, 'the spam check off: MR281'
);
SELECT throws_like(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, %s, 'spam', false)$$,
           pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    '%apt install spamd%--spamd 127.0.0.1:783%mailroom run%',
    'the spam check off says how to get a spamd and turn the check on (issue 44 item 5)'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, %s, 'html')$$,
           pg_temp.a(), pg_temp.t(), (SELECT id FROM p)),
    'MR282', NULL, 'no HTML part: MR282'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, %s, 'dkim')$$,
           pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR283', NULL, 'an unknown check: MR283'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, 'nope', null, %s, 'html')$$, pg_temp.a(), (SELECT id FROM m)),
    'MR204', NULL, 'a wrong token: MR204'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, null, null, %s, 'html')$$, pg_temp.a(), (SELECT id FROM m)),
    'MR240', NULL, 'no credentials: MR240'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, 0, 'links', false)$$, pg_temp.a(), pg_temp.t()),
    'MR209', NULL, 'another message: MR209 before the switch is told'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.messages WHERE id IN ((SELECT id FROM m), (SELECT id FROM p)) AND is_read), 0,
    'a check never marks the message read'
);

-- the rates, in a minute of their own (the checks above counted in the first one)
SET LOCAL mailroom.clock = '2030-01-01 00:02:00+00';
SELECT mailroom.set_setting('checks.rate_per_inbox', '1/min');
SELECT lives_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, %s, 'html')$$, pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'the inbox''s first check this minute'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, %L, null, %s, 'html')$$, pg_temp.a(), pg_temp.t(), (SELECT id FROM m)),
    'MR020', 'rate limit reached: checks.rate_per_inbox allows 1/min; try again in 60 seconds', 'the second: MR020'
);
SELECT mailroom.create_api_key('team-c', sha256('mrk_c'::bytea));
CREATE TEMP TABLE kb AS SELECT mailroom.http_create_mailbox(sha256('mrk_c'::bytea), null) AS doc;
CREATE TEMP TABLE km AS SELECT mailroom.deliver_message(
    (SELECT doc ->> 'address' FROM kb), convert_to(E'Subject: hi\r\n\r\nbody', 'UTF8'), 'a@example.org', 'hi', null, 'x',
    '<p>hi</p>'
) AS id;
SELECT mailroom.set_setting('checks.rate_per_key', '1/min');
SELECT lives_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, null, sha256('mrk_c'::bytea), %s, 'html')$$,
        (SELECT doc ->> 'address' FROM kb), (SELECT id FROM km)),
    'a key''s first check this minute'
);
SELECT throws_ok(
    format($$SELECT * FROM mailroom.http_message_check(%L, null, sha256('mrk_c'::bytea), %s, 'html')$$,
        (SELECT doc ->> 'address' FROM kb), (SELECT id FROM km)),
    'MR020', 'rate limit reached: checks.rate_per_key allows 1/min; try again in 60 seconds', 'its second: MR020 per key'
);

SELECT * FROM finish();
ROLLBACK;
