-- Catch-all domains: check_bounce_recipient creates the inbox of an unknown address on a catch-all
-- domain (owner api, the domain's plan and TTL) within its quota, nothing on other domains, and the
-- admin functions validate their input; subdomain patterns (*.example.com); the sink (issue 44 item 1):
-- off, unchanged 550; on (the server's p_sink or the setting inbox.sink), every recipient at every domain
-- gets an anonymous inbox of plan sink at RCPT, a full one lets its oldest message go, and past
-- sink.max_inboxes or sink.max_bytes the oldest sink inbox is let go. The SMTP side is in
-- tests/http/test_catchall.py and tests/inboxes/test_sink.py.
BEGIN;
SELECT plan(48);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
SELECT lives_ok($$SELECT mailroom.set_catchall_domain('Dev.Example', 'team-1', 'pro', 2, 30)$$, 'a domain becomes catch-all');
SELECT is(
    (SELECT row(domain, owner_id, plan, ttl_minutes, max_open, open_inboxes)::text FROM mailroom.list_catchall_domains()
     WHERE domain = 'dev.example'),
    '(dev.example,team-1,pro,30,2,0)', 'it is listed, lower case, with no open inbox yet'
);
SELECT is(
    (SELECT row(verdict, address)::text FROM mailroom.check_bounce_recipient('<Alice@Dev.Example>')),
    '(ok,alice@dev.example)', 'the first RCPT to an unknown address on it is ok'
);
SELECT is(
    (SELECT row(plan, owner_type::text, owner_id, expires_at, catchall_domain)::text
     FROM mailroom.mailboxes WHERE address = 'alice@dev.example'),
    '(pro,api,team-1,"2030-01-01 00:30:00+00",dev.example)', 'its inbox: the domain''s owner, plan and TTL'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('alice@dev.example')),
    'ok', 'a second RCPT finds the same inbox'
);
SELECT is((SELECT count(*)::int FROM mailroom.mailboxes WHERE catchall_domain = 'dev.example'), 1, 'one inbox, not two');
SELECT is((SELECT verdict FROM mailroom.check_bounce_recipient('bob@dev.example')), 'ok', 'a second address: ok');
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('carol@dev.example')),
    'unknown', 'over the quota of open inboxes: unknown'
);
SELECT ok(NOT EXISTS (SELECT 1 FROM mailroom.mailboxes WHERE address = 'carol@dev.example'), 'and no inbox made');
SET LOCAL mailroom.clock = '2030-01-01 00:31:00+00';
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('carol@dev.example')),
    'ok', 'once the others expired, the quota has room again'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('alice@dev.example')),
    'expired', 'an expired catch-all inbox is expired, not re-created'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('someone@other.example')),
    'unknown', 'a domain that is not catch-all: unknown, nothing created'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_recipient('dave@dev.example')),
    'unknown', 'check_recipient alone (mailbox_accepts, delivery) never creates an inbox'
);
SELECT throws_ok($$SELECT mailroom.set_catchall_domain('not a domain', 'x')$$, 'MR245', NULL, 'a bad domain: MR245');
SELECT throws_ok($$SELECT mailroom.set_catchall_domain('a.example', ' ')$$, 'MR210', NULL, 'no owner: MR210');
SELECT throws_ok($$SELECT mailroom.set_catchall_domain('a.example', 'x', 'gold')$$, 'MR201', NULL, 'unknown plan: MR201');
SELECT ok(
    mailroom.remove_catchall_domain('DEV.example') AND NOT mailroom.remove_catchall_domain('dev.example'),
    'remove: true once, then false'
);

-- subdomain patterns
SELECT lives_ok($$SELECT mailroom.set_catchall_domain('*.Corp.Example', 'team-2', 'free', 5)$$, 'a subdomain pattern is a catch-all domain');
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('ann@deep.b.corp.example')),
    'ok', 'an address at any subdomain of it gets its inbox'
);
SELECT is(
    (SELECT row(owner_type::text, owner_id, catchall_domain)::text FROM mailroom.mailboxes WHERE address = 'ann@deep.b.corp.example'),
    '(api,team-2,*.corp.example)', 'owned by the pattern''s owner, counted under the pattern'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('ann@corp.example')),
    'unknown', 'a pattern does not cover the domain it names'
);
SELECT lives_ok($$SELECT mailroom.set_catchall_domain('b.corp.example', 'team-3')$$, 'a domain under the pattern');
SELECT is((SELECT verdict FROM mailroom.check_bounce_recipient('bo@b.corp.example')), 'ok', 'an address at it');
SELECT is(
    (SELECT owner_id FROM mailroom.mailboxes WHERE address = 'bo@b.corp.example'),
    'team-3', 'the domain itself wins over a pattern'
);
SELECT throws_ok($$SELECT mailroom.set_catchall_domain('*', 'x')$$, 'MR245', NULL, '* is the sink, not a catch-all: MR245');
SELECT throws_ok(
    $$SELECT mailroom.set_catchall_fault('*.corp.example', 'rcpt', '550 5.1.1 no')$$, 'MR296', NULL,
    'a pattern carries no fault (it would never answer): MR296'
);
SELECT throws_ok($$SELECT mailroom.set_catchall_domain('*.com', 'x')$$, 'MR245', NULL, 'a pattern over a top-level domain: MR245');

-- the sink: off by default, the 550 unchanged
SELECT is(
    (SELECT row(verdict, left(reply, 9))::text FROM mailroom.check_bounce_recipient('alice@gmail.com')),
    '(unknown,"550 5.1.1")', 'sink off: an unknown address at another domain is 550 5.1.1'
);
SELECT ok(NOT EXISTS (SELECT 1 FROM mailroom.mailboxes WHERE catchall_domain = '*'), 'and no inbox made');
-- on for one server (its --sink)
SELECT is(
    (SELECT row(verdict, address, reply)::text FROM mailroom.check_bounce_recipient('<Alice@Gmail.com>', 100, p_sink => true)),
    '(ok,alice@gmail.com,)', 'sink on: alice@gmail.com is ok'
);
SELECT is(
    (SELECT row(plan, owner_type::text, owner_id, expires_at, catchall_domain, session_token_digest IS NOT NULL)::text
     FROM mailroom.mailboxes WHERE address = 'alice@gmail.com'),
    '(sink,anonymous,,"2030-01-02 00:31:00+00",*,t)', 'its inbox: plan sink (24 h), anonymous with a token nobody holds, marked *'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('x@sub.example.com', p_sink => true)),
    'ok', 'sink on: a subdomain of any domain too'
);
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('y@sub.example.com')),
    'unknown', 'another server without --sink: still 550'
);
-- on for the database (the setting)
SELECT lives_ok($$SELECT mailroom.set_setting('inbox.sink', 'on')$$, 'the setting inbox.sink');
SELECT is((SELECT verdict FROM mailroom.check_bounce_recipient('carol@x.example')), 'ok', 'with the setting, every server is a sink');
SELECT is(
    (SELECT verdict FROM mailroom.check_bounce_recipient('z@b.corp.example')),
    'ok', 'a catch-all domain keeps its own rule under the sink'
);
SELECT is((SELECT plan FROM mailroom.mailboxes WHERE address = 'z@b.corp.example'), 'free', 'the catch-all''s plan, not the sink''s');
-- a full sink inbox lets its oldest message go
UPDATE mailroom.plans SET max_messages = 2 WHERE name = 'sink';
SELECT lives_ok(
    $$SELECT mailroom.deliver_message('carol@x.example', convert_to('Subject: ' || n || E'\r\n\r\nbody', 'UTF8'), 'a@b.example', '{}')
      FROM generate_series(1, 3) AS n$$,
    'three messages into a sink inbox of two places'
);
SELECT is(
    (SELECT array_agg(split_part(convert_from(g.raw, 'UTF8'), E'\r', 1) ORDER BY g.id)::text FROM mailroom.messages AS g
     JOIN mailroom.mailboxes AS m ON m.id = g.mailbox_id WHERE m.address = 'carol@x.example'),
    '{"Subject: 2","Subject: 3"}', 'the oldest went, the newest two stay'
);
SELECT is(
    (SELECT row(message_count, stored_bytes)::text FROM mailroom.mailboxes WHERE address = 'carol@x.example'),
    '(2,36)', 'its count and bytes are the two kept'
);
SELECT is((SELECT verdict FROM mailroom.check_recipient('carol@x.example')), 'ok', 'a full sink inbox is never full at RCPT');
-- the caps: the oldest sink inbox is let go
SELECT lives_ok($$SELECT mailroom.set_setting('sink.max_inboxes', '3')$$, 'sink.max_inboxes 3');
SELECT is((SELECT verdict FROM mailroom.check_bounce_recipient('dave@y.example')), 'ok', 'a fourth sink inbox is made');
SELECT is(
    (SELECT verdict FROM mailroom.check_recipient('alice@gmail.com')), 'expired', 'and the oldest was let go'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.mailboxes AS m WHERE m.catchall_domain = '*' AND m.is_active), 3,
    'three sink inboxes open'
);
SELECT lives_ok($$SELECT mailroom.set_setting('sink.max_bytes', '1048576')$$, 'sink.max_bytes 1 MiB');
SELECT lives_ok(
    $$SELECT mailroom.deliver_message(a, convert_to(E'Subject: big\r\n\r\n' || repeat('x', 600000), 'UTF8'), 'a@b.example', '{}')
      FROM unnest(ARRAY['x@sub.example.com', 'dave@y.example']) AS a$$,
    '600 kB into each of two sink inboxes'
);
SELECT is(
    (SELECT array_agg(row(address, verdict)::text ORDER BY address)::text FROM (
        SELECT m.address, (SELECT c.verdict FROM mailroom.check_recipient(m.address) AS c) AS verdict
        FROM mailroom.mailboxes AS m WHERE m.catchall_domain = '*') AS b),
    '{"(alice@gmail.com,expired)","(carol@x.example,ok)","(dave@y.example,ok)","(x@sub.example.com,expired)"}',
    'past sink.max_bytes the oldest holding the bytes was let go, never the inbox just written'
);

SELECT * FROM finish();
ROLLBACK;
