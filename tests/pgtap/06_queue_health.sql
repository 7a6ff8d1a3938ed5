-- Queue health: queue_health (due, oldest due age, expired leases per queue), worker_heartbeat and
-- worker_health, their privileges. The plan of every due-count (its partial index, ANALYZE at size):
-- tests/pgtap_fresh/06_queue_health_plans.sql, on the test cluster only. The clock is pinned before any
-- installation existed: every count is of rows made by then (the test's), and no installation's lease
-- has expired nor inbox is due by then (docs/operations.md, "Verifying an installation").
BEGIN;
SELECT plan(46);
\ir fixtures/default_settings.sql

-- ---------------------------------------------------------------- shape and privileges
SELECT has_table('mailroom', 'workers', 'mailroom.workers exists');
SELECT has_function('mailroom', 'queue_health', ARRAY[]::text[], 'queue_health()');
SELECT has_function('mailroom', 'worker_heartbeat', ARRAY['text', 'text', 'boolean', 'integer', 'text', 'text'], 'worker_heartbeat(…)');
SELECT has_function('mailroom', 'worker_health', ARRAY[]::text[], 'worker_health()');
SELECT is(
    (SELECT array_agg(p.proname::text ORDER BY p.proname) FROM pg_proc AS p
     WHERE p.oid IN ('mailroom.queue_health()'::regprocedure, 'mailroom.worker_health()'::regprocedure,
                     'mailroom.worker_heartbeat(text, text, boolean, integer, text, text)'::regprocedure)
       AND p.prosecdef AND p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp']),
    ARRAY['queue_health', 'worker_health', 'worker_heartbeat']::text[],
    'all three are SECURITY DEFINER with search_path = pg_catalog, pg_temp'
);
SELECT ok(
    NOT EXISTS (
        SELECT 1 FROM pg_proc AS p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
        WHERE p.oid IN ('mailroom.queue_health()'::regprocedure, 'mailroom.worker_health()'::regprocedure,
                        'mailroom.worker_heartbeat(text, text, boolean, integer, text, text)'::regprocedure,
                        'mailroom_internal._explain_queue_health()'::regprocedure)
          AND a.grantee = 0
    ),
    'PUBLIC may execute none of them'
);
SELECT ok(
    has_function_privilege('mailroom_monitor', 'mailroom.queue_health()', 'EXECUTE')
    AND has_function_privilege('mailroom_admin', 'mailroom.queue_health()', 'EXECUTE')
    AND has_function_privilege('mailroom_monitor', 'mailroom.worker_health()', 'EXECUTE')
    AND has_function_privilege('mailroom_admin', 'mailroom.worker_health()', 'EXECUTE'),
    'monitor and admin read queue_health and worker_health'
);
SELECT ok(
    NOT has_function_privilege('mailroom_app', 'mailroom.queue_health()', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_sender', 'mailroom.worker_health()', 'EXECUTE'),
    'the application and the workers do not'
);
SELECT ok(
    has_function_privilege('mailroom_collector', 'mailroom.worker_heartbeat(text, text, boolean, integer, text, text)', 'EXECUTE')
    AND has_function_privilege('mailroom_sender', 'mailroom.worker_heartbeat(text, text, boolean, integer, text, text)', 'EXECUTE')
    AND has_function_privilege('mailroom_inbound', 'mailroom.worker_heartbeat(text, text, boolean, integer, text, text)', 'EXECUTE'),
    'collector, sender and inbound report heartbeats'
);
SELECT ok(
    NOT has_function_privilege('mailroom_app', 'mailroom.worker_heartbeat(text, text, boolean, integer, text, text)', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_monitor', 'mailroom.worker_heartbeat(text, text, boolean, integer, text, text)', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_app', 'mailroom.worker_stopped(text, integer)', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_monitor', 'mailroom.worker_stopped(text, integer)', 'EXECUTE'),
    'the application and the monitor do not (nor say a worker stopped)'
);
SELECT ok(
    has_function_privilege('mailroom_admin', 'mailroom.worker_heartbeat(text, text, boolean, integer, text, text)', 'EXECUTE')
    AND has_function_privilege('mailroom_admin', 'mailroom.worker_stopped(text, integer)', 'EXECUTE')
    AND has_function_privilege('mailroom_inbound', 'mailroom.worker_stopped(text, integer)', 'EXECUTE'),
    'an admin login runs `maintain --every` as a worker: it reports in and stops too'
);
SELECT ok(
    NOT has_table_privilege('mailroom_monitor', 'mailroom.workers', 'SELECT')
    AND NOT has_table_privilege('mailroom_sender', 'mailroom.workers', 'INSERT'),
    'the workers table is reached through the functions only'
);

-- ---------------------------------------------------------------- queue_health, pinned clock
SET LOCAL mailroom.clock = '2000-01-01 00:00:00+00';
SELECT results_eq(
    'SELECT queue, due, oldest_due_age_seconds, expired_leases FROM mailroom.queue_health()',
    $$VALUES ('outbound', 0::bigint, 0::float8, 0::bigint), ('tokens', 0, 0, NULL), ('inbox_expiry', 0, 0, NULL)$$,
    'empty queues: one row each, nothing due'
);
SELECT mailroom.upsert_sender('qh', 'robot@mailroom.test', '127.0.0.1', 2525);
SELECT mailroom.enqueue_message('qh', ARRAY['a' || g || '@example.com'], 's' || g, 't') FROM generate_series(1, 3) AS g;
SELECT mailroom.enqueue_message('qh', ARRAY['later@example.com'], 'later', 't', p_send_after => '2000-01-01 01:00Z');
SELECT mailroom.create_account('qh@example.com', 'qh');
SELECT mailroom.create_mailbox(10);

SET LOCAL mailroom.clock = '2000-01-01 00:01:30+00';
CREATE TEMP TABLE h1 ON COMMIT DROP AS SELECT * FROM mailroom.queue_health();
SELECT is((SELECT due FROM h1 WHERE queue = 'outbound'), 3::bigint, 'outbound: three due, the later one is not');
SELECT is((SELECT oldest_due_age_seconds FROM h1 WHERE queue = 'outbound'), 90::float8, 'outbound: due for 90 s');
SELECT is((SELECT expired_leases FROM h1 WHERE queue = 'outbound'), 0::bigint, 'outbound: no lease expired');
SELECT is((SELECT due FROM h1 WHERE queue = 'tokens'), 1::bigint, 'tokens: the activation token is pending');
SELECT is((SELECT oldest_due_age_seconds FROM h1 WHERE queue = 'tokens'), 90::float8, 'tokens: pending for 90 s');
SELECT is((SELECT due FROM h1 WHERE queue = 'inbox_expiry'), 0::bigint, 'inbox_expiry: nothing due before expires_at');

SELECT is((SELECT count(*)::integer FROM mailroom.claim_messages(1, 'qh-w', '60 seconds')), 1, 'one claimed, lease 60 s');
SELECT is((SELECT count(*)::integer FROM mailroom.dequeue_tokens(10, decode(repeat('ab', 32), 'hex'))), 1, 'the token dispatched');
SET LOCAL mailroom.clock = '2000-01-01 00:11:00+00';
CREATE TEMP TABLE h2 ON COMMIT DROP AS SELECT * FROM mailroom.queue_health();
SELECT is((SELECT due FROM h2 WHERE queue = 'outbound'), 2::bigint, 'outbound: the claimed one is no longer due');
SELECT is((SELECT oldest_due_age_seconds FROM h2 WHERE queue = 'outbound'), 660::float8, 'outbound: the oldest due is 11 min old');
SELECT is((SELECT expired_leases FROM h2 WHERE queue = 'outbound'), 1::bigint, 'outbound: its lease expired (a dead worker)');
SELECT is((SELECT due FROM h2 WHERE queue = 'tokens'), 0::bigint, 'tokens: nothing pending after the dispatch');
SELECT is((SELECT due FROM h2 WHERE queue = 'inbox_expiry'), 1::bigint, 'inbox_expiry: the 10-minute inbox is due');
SELECT is((SELECT oldest_due_age_seconds FROM h2 WHERE queue = 'inbox_expiry'), 60::float8, 'inbox_expiry: due for 60 s');
SELECT is(mailroom.expire_mailboxes(), 1, 'expired');
SELECT is((SELECT due FROM mailroom.queue_health() WHERE queue = 'inbox_expiry'), 0::bigint, 'inbox_expiry: nothing due after');

-- ---------------------------------------------------------------- heartbeats
SET LOCAL mailroom.clock = '2000-01-02 00:00:00+00';
SELECT lives_ok($$SELECT mailroom.worker_heartbeat('host-a:101', 'sender', true)$$, 'a sender reports in');
SELECT is(
    (SELECT row(kind, host, listening, last_claim_at IS NULL, claimed)::text FROM mailroom.workers WHERE worker = 'host-a:101'),
    '(sender,host-a,t,t,0)', 'its row: kind, host from the name, listening, no claim yet'
);
SET LOCAL mailroom.clock = '2000-01-02 00:00:10+00';
SELECT mailroom.worker_heartbeat('host-a:101', 'sender', false, 5);
SELECT mailroom.worker_heartbeat('host-b:7', 'collector', true, 0);
SET LOCAL mailroom.clock = '2000-01-02 00:00:40+00';
SELECT results_eq(
    $$SELECT worker, kind, host, listening, heartbeat_age_seconds, listener_age_seconds, last_claim_age_seconds, claimed
      FROM mailroom.worker_health() WHERE worker LIKE 'host-%'$$,
    $$VALUES ('host-b:7', 'collector', 'host-b', true, 30::float8, 30::float8, NULL::float8, 0::bigint),
             ('host-a:101', 'sender', 'host-a', false, 30, 40, 30, 5)$$,
    'worker_health: heartbeat, listener and claim ages per worker'
);
SELECT mailroom.worker_heartbeat('host-a:101', 'sender', false, 2);
SELECT is((SELECT claimed FROM mailroom.workers WHERE worker = 'host-a:101'), 7::bigint, 'claims add up');
SELECT throws_ok($$SELECT mailroom.worker_heartbeat('x:1', 'bogus', true)$$, '22023',
    'worker_heartbeat: kind must be one of collector, expiry, http, inbound, maintenance, sender, got ''bogus''',
    'an unknown kind is 22023 naming the kinds of mailroom.worker_kinds');
SELECT throws_ok($$SELECT mailroom.worker_heartbeat('', 'sender', true)$$, '22023', NULL, 'an empty name is 22023');
SELECT throws_ok($$SELECT mailroom.worker_heartbeat('x:1', 'sender', true, -1)$$, '22023', NULL, 'negative claims are 22023');
SELECT is(
    (SELECT array_agg(kind ORDER BY kind) FROM mailroom.list_worker_kinds()),
    ARRAY['collector', 'expiry', 'http', 'inbound', 'maintenance', 'sender'],
    'every long-running command has its kind (list_worker_kinds)'
);

-- running, lost, stopped
SELECT mailroom.worker_heartbeat('host-i:9', 'inbound', false, 0, '127.0.0.1:9102', 'smtp 127.0.0.1:2525');
SELECT is(
    (SELECT row(state, metrics_address, serves)::text FROM mailroom.worker_health() WHERE worker = 'host-i:9'),
    '(running,127.0.0.1:9102,"smtp 127.0.0.1:2525")',
    'the inbound server reports in: running, its metrics address and what it serves'
);
SET LOCAL mailroom.clock = '2000-01-02 00:01:41+00';
SELECT mailroom.worker_heartbeat('host-i:9', 'inbound', false, 0, '127.0.0.1:9102', 'smtp 127.0.0.1:2525');
SELECT results_eq(
    $$SELECT worker, state FROM mailroom.worker_health() WHERE worker LIKE 'host-%'$$,
    $$VALUES ('host-i:9', 'running'), ('host-b:7', 'lost'), ('host-a:101', 'lost')$$,
    'a worker silent for longer than workers.lost_after (1 minute) is lost; running ones come first'
);
SELECT ok(mailroom.worker_stopped('host-a:101', 3), 'a clean exit: worker_stopped with its last claims');
SELECT ok(NOT mailroom.worker_stopped('never:1'), 'a worker that never reported in: false');
SELECT is(
    (SELECT row(state, listening, claimed)::text FROM mailroom.worker_health() WHERE worker = 'host-a:101'),
    '(stopped,f,10)', 'stopped, not listening, its last claims counted'
);
SELECT is(
    (SELECT state FROM mailroom.worker_health() WHERE worker LIKE 'host-%' ORDER BY 1 DESC LIMIT 1), 'stopped',
    'stopped workers come last'
);
SET LOCAL mailroom.clock = '2000-01-02 00:02:00+00';
SELECT mailroom.worker_heartbeat('host-a:101', 'sender', true, 1);
SELECT is(
    (SELECT row(state, claimed, started_at)::text FROM mailroom.worker_health() WHERE worker = 'host-a:101'),
    '(running,1,"2000-01-02 00:02:00+00")',
    'a new process under a stopped worker''s name starts afresh (started_at, claimed)'
);
SELECT mailroom.worker_stopped('host-a:101');
SET LOCAL mailroom.clock = '2000-01-02 01:02:01+00';
SELECT mailroom.worker_heartbeat('host-i:9', 'inbound', false);
SELECT is(
    (SELECT array_agg(worker ORDER BY worker) FROM mailroom.workers WHERE worker LIKE 'host-%'), ARRAY['host-b:7', 'host-i:9'],
    'a worker stopped for longer than workers.forget_stopped_after (1 hour) is forgotten; a lost one is kept'
);
SET LOCAL mailroom.clock = '2000-01-03 00:01:00+00';
SELECT mailroom.worker_heartbeat('host-c:1', 'expiry', false);
SELECT is(
    (SELECT array_agg(worker ORDER BY worker) FROM mailroom.workers WHERE worker LIKE 'host-%'), ARRAY['host-c:1', 'host-i:9'],
    'workers silent for longer than workers.forget_after (1 day) are forgotten'
);

SELECT * FROM finish();
ROLLBACK;
