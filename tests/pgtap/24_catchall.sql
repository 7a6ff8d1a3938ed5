-- Catch-all domains: check_bounce_recipient creates the inbox of an unknown address on a catch-all
-- domain (owner api, the domain's plan and TTL) within its quota, nothing on other domains, and the
-- admin functions validate their input. The SMTP side is in tests/http/test_catchall.py.
BEGIN;
SELECT plan(17);
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

SELECT * FROM finish();
ROLLBACK;
