-- Mailboxes: TTL clamping per plan, addresses, owners, extend, soft delete, authorization.
BEGIN;
SELECT plan(65);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';

SELECT has_table('mailroom', 'plans', 'plans table exists');
SELECT has_table('mailroom', 'mailboxes', 'mailboxes table exists');
SELECT has_table('mailroom', 'messages', 'messages table exists');
SELECT has_index('mailroom', 'mailboxes', 'mailboxes_expiry_idx', 'partial index for the expiry sweep');
SELECT is(
    (SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index AS i
        WHERE i.indexrelid = 'mailroom.mailboxes_expiry_idx'::regclass),
    'is_active',
    'the expiry index only holds active mailboxes'
);
SELECT has_index('mailroom', 'messages', 'messages_mailbox_received_idx', 'messages by (mailbox_id, received_at)');
SELECT results_eq(
    $$SELECT name, max_ttl_minutes FROM mailroom.plans ORDER BY max_ttl_minutes, name$$,
    $$VALUES ('free', 60), ('pro', 1440), ('sink', 1440), ('enterprise', 10080)$$,
    'seeded plans and their TTL caps'
);

-- TTL clamping: min(requested or plan default, plan max).
CREATE TEMP TABLE boxes AS
SELECT 'free_default' AS k, * FROM mailroom.create_mailbox();
INSERT INTO boxes SELECT 'free_30', * FROM mailroom.create_mailbox(30, 'free');
INSERT INTO boxes SELECT 'free_500', * FROM mailroom.create_mailbox(500, 'free');
INSERT INTO boxes SELECT 'pro_5000', * FROM mailroom.create_mailbox(5000, 'pro');
INSERT INTO boxes SELECT 'pro_default', * FROM mailroom.create_mailbox(NULL, 'pro');
INSERT INTO boxes SELECT 'ent_99999', * FROM mailroom.create_mailbox(99999, 'enterprise');
INSERT INTO boxes SELECT 'api', * FROM mailroom.create_mailbox(20, 'pro', 'api', 'client-7');

SELECT is((SELECT expires_at FROM boxes WHERE k = 'free_default'), '2030-01-01 00:10:00+00'::timestamptz,
    'free default TTL is 10 minutes');
SELECT is((SELECT expires_at FROM boxes WHERE k = 'free_30'), '2030-01-01 00:30:00+00'::timestamptz,
    'requested TTL under the cap is kept');
SELECT is((SELECT expires_at FROM boxes WHERE k = 'free_500'), '2030-01-01 01:00:00+00'::timestamptz,
    'free TTL clamps to 60 minutes');
SELECT is((SELECT expires_at FROM boxes WHERE k = 'pro_5000'), '2030-01-02 00:00:00+00'::timestamptz,
    'pro TTL clamps to 1,440 minutes');
SELECT is((SELECT expires_at FROM boxes WHERE k = 'pro_default'), '2030-01-01 01:00:00+00'::timestamptz,
    'pro default TTL is 60 minutes');
SELECT is((SELECT expires_at FROM boxes WHERE k = 'ent_99999'), '2030-01-08 00:00:00+00'::timestamptz,
    'enterprise TTL clamps to 10,080 minutes');

SELECT throws_ok($$SELECT * FROM mailroom.create_mailbox(0)$$, 'MR202',
    'TTL must be a positive number of minutes, got 0', 'zero TTL is refused');
SELECT throws_ok($$SELECT * FROM mailroom.create_mailbox(-5)$$, 'MR202',
    'TTL must be a positive number of minutes, got -5', 'negative TTL is refused');
SELECT throws_ok($$SELECT * FROM mailroom.create_mailbox(10, 'gold')$$, 'MR201',
    'unknown plan ''gold''', 'unknown plan is refused');
SELECT throws_ok($$SELECT * FROM mailroom.create_mailbox(10, 'free', 'robot')$$, 'MR210',
    'unknown owner type ''robot'' (anonymous, api or mcp)', 'unknown owner type is refused');
SELECT throws_ok($$SELECT * FROM mailroom.create_mailbox(10, 'free', 'api')$$, 'MR210',
    'a mailbox owned by api needs an owner id', 'api mailbox without owner id is refused');
SELECT throws_ok($$SELECT * FROM mailroom.create_mailbox(10, 'free', 'anonymous', 'x')$$, 'MR210',
    'an anonymous mailbox has no owner id (it is authorized by its session token)',
    'anonymous mailbox with an owner id is refused');

-- Addresses: random 80-bit hex local part at the configured domain; tokens only as digests.
SELECT ok((SELECT bool_and(address ~ '^[0-9a-f]{20}@mailroom\.test$') FROM boxes),
    'addresses carry 20 hex characters (80 bits) at inbox.domain');
SELECT is((SELECT count(DISTINCT address) FROM boxes), 7::bigint, 'addresses are distinct');
SELECT ok((SELECT bool_and(length(session_token) = 32) FROM boxes WHERE k <> 'api'),
    'anonymous mailboxes get a 32-character session token');
SELECT is((SELECT session_token FROM boxes WHERE k = 'api'), NULL, 'api mailboxes get no session token');
SELECT is(
    (SELECT count(*) FROM mailroom.mailboxes AS m JOIN boxes AS b ON b.mailbox_id = m.id
        WHERE m.session_token_digest = digest(b.session_token, 'sha256')),
    6::bigint,
    'only the sha256 of the token is stored'
);
DO $$ BEGIN PERFORM mailroom.set_setting('inbox.domain', 'Inbox.Example.ORG'); END $$;
SELECT matches((SELECT address FROM mailroom.create_mailbox()), '@inbox\.example\.org$',
    'the domain comes from the inbox.domain setting, lower-cased');
SELECT throws_ok(
    $$INSERT INTO mailroom.mailboxes (address, plan, session_token_digest, expires_at, created_at)
      VALUES ('Upper@X.test', 'free', '\x00', now(), now())$$,
    '23514', NULL, 'stored addresses are lower case, so the unique key is case-insensitive'
);

-- Authorization and case-insensitive lookup.
SELECT lives_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)',
        (SELECT upper(address) FROM boxes WHERE k = 'free_30'), (SELECT session_token FROM boxes WHERE k = 'free_30')),
    'address lookup is case-insensitive'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)',
        (SELECT address FROM boxes WHERE k = 'free_30'), 'wrong-token'),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)', 'wrong session token is refused'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, NULL)', (SELECT address FROM boxes WHERE k = 'free_30')),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)', 'NULL token is refused'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, %L)',
        (SELECT address FROM boxes WHERE k = 'free_30'), (SELECT session_token FROM boxes WHERE k = 'pro_5000')),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)',
    'another mailbox''s token is refused'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.list_messages('nobody@mailroom.test', 'x')$$,
    'MR203', 'mailbox not found', 'unknown address is MR203'
);
SELECT lives_ok(
    format('SELECT * FROM mailroom.list_messages(%L, NULL, %L, %L)',
        (SELECT address FROM boxes WHERE k = 'api'), 'api', 'client-7'),
    'the owner reads its api mailbox without a token'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, NULL, %L, %L)',
        (SELECT address FROM boxes WHERE k = 'api'), 'mcp', 'client-7'),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)', 'owner type must match'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.list_messages(%L, NULL, %L, %L)',
        (SELECT address FROM boxes WHERE k = 'api'), 'api', 'client-8'),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)', 'another owner is refused'
);

-- Owners list their mailboxes.
INSERT INTO boxes SELECT 'api2', * FROM mailroom.create_mailbox(5, 'free', 'api', 'client-7');
SELECT results_eq(
    $$SELECT address FROM mailroom.list_mailboxes('api', 'client-7')$$,
    $$SELECT address FROM boxes WHERE k IN ('api', 'api2') ORDER BY mailbox_id$$,
    'list_mailboxes returns the owner''s open mailboxes, oldest first'
);
SELECT is((SELECT count(*) FROM mailroom.list_mailboxes('mcp', 'client-7')), 0::bigint, 'owner type must match');
SET LOCAL mailroom.clock = '2030-01-01 00:10:00+00';
SELECT results_eq(
    $$SELECT address, is_open FROM mailroom.list_mailboxes('api', 'client-7', p_include_closed => true)$$,
    $$SELECT address, k = 'api' FROM boxes WHERE k IN ('api', 'api2') ORDER BY mailbox_id$$,
    'expired mailboxes show up closed only with p_include_closed'
);
SELECT is((SELECT count(*) FROM mailroom.list_mailboxes('api', 'client-7')), 1::bigint, 'by default only open ones');
SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';

-- Extend within the plan cap.
SELECT is(
    mailroom.extend_mailbox((SELECT address FROM boxes WHERE k = 'free_30'),
        (SELECT session_token FROM boxes WHERE k = 'free_30'), 15),
    '2030-01-01 00:45:00+00'::timestamptz,
    'extend adds minutes'
);
SELECT is(
    mailroom.extend_mailbox((SELECT address FROM boxes WHERE k = 'free_30'),
        (SELECT session_token FROM boxes WHERE k = 'free_30'), 600),
    '2030-01-01 01:00:00+00'::timestamptz,
    'extend is capped at now + the plan max TTL'
);
SELECT throws_ok(
    format('SELECT mailroom.extend_mailbox(%L, %L, 0)',
        (SELECT address FROM boxes WHERE k = 'free_30'), (SELECT session_token FROM boxes WHERE k = 'free_30')),
    'MR202', 'extension must be a positive number of minutes, got 0', 'extend by 0 is refused'
);

-- Soft delete.
SELECT is(
    mailroom.delete_mailbox((SELECT address FROM boxes WHERE k = 'pro_default'),
        (SELECT session_token FROM boxes WHERE k = 'pro_default')),
    true, 'delete_mailbox soft-deletes'
);
SELECT results_eq(
    $$SELECT is_active, deleted_at, inactive_since FROM mailroom.mailboxes
      WHERE address = (SELECT address FROM boxes WHERE k = 'pro_default')$$,
    $$VALUES (false, '2030-01-01 00:00:00+00'::timestamptz, '2030-01-01 00:00:00+00'::timestamptz)$$,
    'the row stays, inactive, with deleted_at'
);
SELECT is(
    mailroom.delete_mailbox((SELECT address FROM boxes WHERE k = 'pro_default'),
        (SELECT session_token FROM boxes WHERE k = 'pro_default')),
    false, 'deleting twice answers false'
);
SELECT throws_like(
    format('SELECT * FROM mailroom.list_messages(%L, %L)',
        (SELECT address FROM boxes WHERE k = 'pro_default'), (SELECT session_token FROM boxes WHERE k = 'pro_default')),
    'mailbox was deleted at %', 'a deleted mailbox cannot be listed'
);
SELECT is((SELECT verdict FROM mailroom.check_recipient((SELECT address FROM boxes WHERE k = 'pro_default'))), 'deleted',
    'a deleted mailbox refuses mail');
SELECT throws_ok(
    format('SELECT mailroom.delete_mailbox(%L, %L)',
        (SELECT address FROM boxes WHERE k = 'free_30'), 'nope'),
    'MR204', 'not authorized for this mailbox (wrong session token or owner)', 'delete needs authorization'
);

-- check_recipient: the verdict and the normalized address the server de-duplicates by.
SELECT results_eq(
    format('SELECT verdict, address FROM mailroom.check_recipient(%L)',
        ' <' || (SELECT upper(address) FROM boxes WHERE k = 'free_30') || '> '),
    format('VALUES (%L, %L)', 'ok', (SELECT address FROM boxes WHERE k = 'free_30')),
    'check_recipient answers ok with the stored form of an address given with case, brackets and spaces'
);
SELECT results_eq(
    $$SELECT verdict, address FROM mailroom.check_recipient('<Nobody@Mailroom.TEST>')$$,
    $$VALUES ('unknown', 'nobody@mailroom.test')$$,
    'an unknown address is normalized too'
);
SELECT is(
    (SELECT count(*) FROM mailroom.check_recipient((SELECT address FROM boxes WHERE k = 'free_30'), 10)),
    1::bigint, 'check_recipient returns exactly one row'
);
SELECT ok(
    mailroom.mailbox_accepts(' ' || (SELECT upper(address) FROM boxes WHERE k = 'free_30')),
    'mailbox_accepts keeps its boolean'
);

-- One rule for "open": _mailbox_open, and nowhere else except the sweep's index condition.
SELECT ok(
    mailroom_internal._mailbox_open((SELECT m FROM mailroom.mailboxes AS m JOIN boxes USING (address) WHERE k = 'free_30')),
    'an active mailbox before its expiry is open'
);
SELECT set_config('mailroom.clock', (
    SELECT m.expires_at::text FROM mailroom.mailboxes AS m JOIN boxes USING (address) WHERE k = 'free_30'
), true);
SELECT ok(
    NOT mailroom_internal._mailbox_open((SELECT m FROM mailroom.mailboxes AS m JOIN boxes USING (address) WHERE k = 'free_30')),
    'at the expiry instant it is closed, though the sweep has not run'
);
SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
SELECT ok(
    NOT mailroom_internal._mailbox_open((SELECT m FROM mailroom.mailboxes AS m JOIN boxes USING (address) WHERE k = 'pro_default')),
    'a deleted mailbox is closed'
);
SELECT ok(
    NOT mailroom_internal._mailbox_open(
        (SELECT jsonb_populate_record(m, '{"is_active": false}') FROM mailroom.mailboxes AS m JOIN boxes USING (address)
            WHERE k = 'pro_5000')
    ),
    'an inactive mailbox is closed whatever its expires_at'
);
SELECT is(
    (
        SELECT string_agg(p.proname, ', ' ORDER BY p.proname)
        FROM pg_proc AS p
        WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)
            -- the functions about mailboxes (tokens have an expires_at of their own)
            AND p.prosrc ~ 'mailroom\.mailboxes|v_box|p_box|p_is_active'
            AND p.prosrc ~ 'expires_at\s*(>|<=)\s*(mailroom\.clock\(\)|p_at|p_now)'
    ),
    '_expire_due_mailboxes, _mailbox_open',
    'the open/expired comparison is written in _mailbox_open(…, at) and, as its index condition, in expire_mailboxes'' seam _expire_due_mailboxes only'
);
SELECT is(
    (
        SELECT string_agg(p.provolatile::text, ',' ORDER BY p.pronargs)
        FROM pg_proc AS p
        WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace) AND p.proname = '_mailbox_open'
    ),
    's,i',
    '_mailbox_open(box) reads the clock (STABLE); _mailbox_open(…, at) is IMMUTABLE, so Citus lets an UPDATE call it with a column reference'
);
SELECT ok(
    mailroom_internal._mailbox_open(true, null, '2030-01-01 00:00Z', '2029-12-31 23:59:59.999999Z')
    AND NOT mailroom_internal._mailbox_open(true, null, '2030-01-01 00:00Z', '2030-01-01 00:00Z')
    AND NOT mailroom_internal._mailbox_open(false, null, '2030-01-01 00:00Z', '2029-01-01 00:00Z')
    AND NOT mailroom_internal._mailbox_open(true, '2028-01-01 00:00Z', '2030-01-01 00:00Z', '2029-01-01 00:00Z'),
    '_mailbox_open(is_active, deleted_at, expires_at, at): open a microsecond before expires_at, closed at it, when inactive or deleted'
);
SELECT is(
    (SELECT is_open FROM mailroom.list_mailboxes('api', 'client-7', true) WHERE address = (SELECT address FROM boxes WHERE k = 'api')),
    true, 'list_mailboxes says is_open by the same rule'
);

-- list_plans: what MR201's hint names, for the roles that create inboxes or watch them
SELECT results_eq(
    $$SELECT name, default_ttl_minutes, max_ttl_minutes FROM mailroom.list_plans()$$,
    $$VALUES ('free', 10, 60), ('pro', 60, 1440), ('sink', 1440, 1440), ('enterprise', 1440, 10080)$$,
    'list_plans: every plan with its TTL default and ceiling, shortest first'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.list_plans() AS l
     INNER JOIN mailroom.plans AS p ON p.name = l.name AND p.when_full = l.when_full),
    (SELECT count(*)::int FROM mailroom.plans),
    'list_plans: what a full inbox of each plan does (when_full)'
);
SELECT throws_ok($$SELECT * FROM mailroom.create_mailbox(10, 'gold')$$, 'MR201', NULL, 'an unknown plan: MR201 ...');
SELECT ok(
    has_function_privilege('mailroom_app', 'mailroom.list_plans()', 'EXECUTE')
    AND has_function_privilege('mailroom_admin', 'mailroom.list_plans()', 'EXECUTE')
    AND has_function_privilege('mailroom_monitor', 'mailroom.list_plans()', 'EXECUTE'),
    '... whose hint (SELECT name FROM mailroom.list_plans()) the application may run'
);

-- plus-addressing at RCPT: the box's verdict, the box's address (one copy per box); one of this test's boxes
SELECT is(
    (SELECT row(c.verdict, c.address)::text FROM mailroom.check_recipient(
        (SELECT replace(upper(address), '@', '+Tag@') FROM mailroom.mailboxes WHERE is_active AND created_at >= '2030-01-01Z' ORDER BY id LIMIT 1)) AS c),
    (SELECT row('ok', address)::text FROM mailroom.mailboxes WHERE is_active AND created_at >= '2030-01-01Z' ORDER BY id LIMIT 1),
    'box+tag@: the box''s verdict and address'
);
SELECT is(
    (SELECT c.verdict FROM mailroom.check_recipient('nobody+tag@mailroom.test') AS c), 'unknown',
    'a plus address of no box: unknown'
);

SELECT * FROM finish();
ROLLBACK;
