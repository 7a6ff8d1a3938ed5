-- Who listens (sql/08_notify.sql): the registry, its pruning, notify.always, and that only
-- deliver_message consults it (docs/architecture.md, "NOTIFY, channel by channel"; each channel's
-- rule is checked end to end by tests/db/test_notify_channels.py).
BEGIN;
SELECT plan(23);
\ir fixtures/default_settings.sql
-- whether a NOTIFY on one channel may be heard, by the registry's rule
CREATE FUNCTION pg_temp.heard(text) RETURNS boolean LANGUAGE sql AS $$
    SELECT $1 = ANY (mailroom_internal._listened_channels(ARRAY[$1])) $$;

SELECT has_table('mailroom', 'listeners', 'mailroom.listeners exists');
SELECT is(mailroom.setting('notify.always'), 'false', 'a fresh install notifies the registered channels only where registered');
SELECT is(
    (
        SELECT string_agg(p.proname, ', ' ORDER BY p.proname)
        FROM pg_proc AS p
        WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace) AND p.prosrc ~ 'mailroom_internal\._(notify_each|listened_channels)\('
            AND p.proname NOT IN ('_notify_each', '_listened_channels')
    ),
    'delete_mailbox, deliver_message',
    'only deliver_message and delete_mailbox (its deletion on mailroom_inbox, ending the waits) notify through the registry (mailroom_inbox, mailroom_delivery): other channels always'
);
SELECT ok(
    (SELECT prosrc ~ 'pg_notify\(mailroom\.setting\(''tokens\.channel''\)' FROM pg_proc
        WHERE oid = 'mailroom_internal._announce_tokens(bigint)'::regprocedure),
    'the token channel (the seed''s token_insert) is notified with pg_notify, no registry'
);

SELECT ok(NOT pg_temp.heard('mailroom_inbox'), 'nobody registered: not listened');
SELECT lives_ok($$SELECT mailroom.listen(ARRAY['mailroom_inbox', 'mailroom_inbox', 'token_insert'])$$,
                'listen registers (a channel named twice once)');
SELECT is((SELECT count(*)::int FROM mailroom.listeners WHERE pid = pg_backend_pid()), 2,
          'one row per channel for this session');
SELECT ok(pg_temp.heard('mailroom_inbox') AND pg_temp.heard('token_insert'), 'both listened');
SELECT ok(NOT pg_temp.heard('mailroom_delivery'), 'another channel still not listened');

-- a session that ended (no live backend has this pid) is pruned by the next listen
INSERT INTO mailroom.listeners (channel, pid) VALUES ('mailroom_delivery', -42);
SELECT ok(pg_temp.heard('mailroom_delivery'), 'a stale row counts until pruned (a NOTIFY too many, never one too few)');
SELECT mailroom.listen(ARRAY['mailroom_inbox']);
SELECT ok(NOT pg_temp.heard('mailroom_delivery'), 'listen prunes the rows of ended sessions');

-- several channels in one statement (deliver_message's two), in the order asked
SELECT is(
    mailroom_internal._listened_channels(ARRAY['mailroom_delivery', 'mailroom_inbox']), ARRAY['mailroom_inbox'],
    '_listened_channels: of the channels asked, the registered ones'
);
SELECT mailroom.set_setting('notify.always', 'true');
SELECT ok(pg_temp.heard('mailroom_delivery'), 'notify.always: every channel is notified');
SELECT is(
    mailroom_internal._listened_channels(ARRAY['mailroom_delivery', 'mailroom_inbox']), ARRAY['mailroom_delivery', 'mailroom_inbox'],
    '_listened_channels under notify.always: every channel asked, in the order asked'
);
SELECT mailroom.set_setting('notify.always', 'false');

SELECT mailroom.unlisten();
SELECT ok(NOT pg_temp.heard('mailroom_inbox'), 'unlisten removes this session''s rows');

SELECT throws_ok($$SELECT mailroom.listen(ARRAY[''])$$, '22023', NULL, 'an empty channel name is refused');
SELECT ok(mailroom.await_writers('1 second'), 'await_writers: no other writer, returns at once');
-- bounded caller-supplied work (issue 34): a wait of at most a minute, at most 16 channels
SELECT throws_ok($$SELECT mailroom.await_writers('2 minutes')$$, 'MR015', NULL, 'await_writers: over a minute is refused');
SELECT throws_ok($$SELECT mailroom.await_writers('-1 second')$$, 'MR015', NULL, 'await_writers: a negative wait is refused');
SELECT throws_ok($$SELECT mailroom.await_writers(NULL)$$, 'MR015', NULL, 'await_writers: NULL (no bound) is refused');
SELECT throws_ok(
    $$SELECT mailroom.listen(ARRAY(SELECT 'c' || g FROM generate_series(1, 17) AS g))$$, 'MR016', NULL,
    'listen: more than 16 channels are refused'
);
SELECT throws_ok($$SELECT mailroom.listen('{}')$$, 'MR016', NULL, 'listen: no channel is refused');
SELECT ok(
    has_function_privilege('mailroom_collector', 'mailroom.listen(text[])', 'EXECUTE')
    AND NOT has_function_privilege('public', 'mailroom.listen(text[])', 'EXECUTE'),
    'the runtime roles may register; PUBLIC may not'
);

SELECT * FROM finish();
ROLLBACK;
