-- Outbound: claim_messages (what is due, lease, token, order). Its plan at any queue size (ANALYZE,
-- 200k rows): tests/pgtap_fresh/33_outbound_claim_plans.sql, on the test cluster only.
BEGIN;
SELECT plan(25);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: a row is due once made (created_at <= clock), so the
-- claim meets the test's rows alone (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);
SELECT mailroom.enqueue_message('tap', ARRAY['a' || g || '@example.com'], 's' || g, 't') FROM generate_series(1, 5) AS g;
SELECT mailroom.enqueue_message('tap', ARRAY['later@example.com'], 'later', 't', p_send_after => '2000-01-01 01:00Z');
-- a retry that is not due yet
UPDATE mailroom.outbound_messages SET attempts = 1, next_retry_at = '2000-01-01 00:05Z' WHERE subject = 's5' AND created_at <= mailroom.clock();

CREATE TEMP TABLE c1 ON COMMIT DROP AS SELECT * FROM mailroom.claim_messages(3, 'w1');
SELECT is((SELECT count(*)::integer FROM c1), 3, 'the limit is honoured');
SELECT is(
    (SELECT array_agg(subject ORDER BY id) FROM c1), ARRAY['s1', 's2', 's3'], 'oldest due rows first'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.outbound_messages WHERE status = 'processing' AND claimed_by = 'w1'
        AND claimed_at = '2000-01-01 00:00Z' AND lease_expires_at = '2000-01-01 00:05Z'),
    3,
    'claimed rows are processing under the default lease (outbound.lease = 5 minutes)'
);
SELECT is(
    (SELECT count(DISTINCT claim_token)::integer FROM c1), 3, 'each claimed row gets its own fencing token'
);
SELECT is(
    (SELECT smtp_host || ':' || smtp_port || ' ' || smtp_security || ' ' || from_address FROM c1 LIMIT 1),
    '127.0.0.1:2525 none robot@mailroom.test',
    'claim returns the relay settings'
);
CREATE TEMP TABLE c2 ON COMMIT DROP AS SELECT * FROM mailroom.claim_messages(100, 'w2', '30 seconds');
SELECT is(
    (SELECT array_agg(subject ORDER BY id) FROM c2), ARRAY['s4'],
    'claimed rows, future send-after and not-yet-due retries are left alone'
);
SELECT is(
    (SELECT lease_expires_at FROM mailroom.outbound_messages WHERE subject = 's4' AND created_at <= mailroom.clock()),
    '2000-01-01 00:00:30Z'::timestamptz,
    'p_lease overrides the lease'
);
SET LOCAL mailroom.clock = '2000-01-01 00:05Z';
SELECT is(
    (SELECT array_agg(subject) FROM mailroom.claim_messages(100, 'w3')), ARRAY['s5'],
    'a retry is claimed once next_retry_at has come'
);
SET LOCAL mailroom.clock = '2000-01-01 01:00Z';
SELECT is(
    (SELECT array_agg(subject) FROM mailroom.claim_messages(100, 'w3')), ARRAY['later'],
    'a send-after message is claimed once its time has come'
);

SELECT throws_ok($$SELECT * FROM mailroom.claim_messages(0, 'w')$$, 'MR320', 'claim limit must be between 1 and 10000, got 0', 'limit 0 is MR320');
SELECT throws_ok($$SELECT * FROM mailroom.claim_messages(NULL, 'w')$$, 'MR320', NULL, 'a NULL limit is MR320');
SELECT throws_ok($$SELECT * FROM mailroom.claim_messages(10, '')$$, 'MR321', 'worker name must be 1-200 characters', 'an empty worker name is MR321');
SELECT throws_ok($$SELECT * FROM mailroom.claim_messages(10, 'w', '-1 minute')$$, 'MR322', NULL, 'a negative lease is MR322');
SELECT throws_ok($$SELECT * FROM mailroom.claim_messages(10, 'w', '\x01'::bytea, NULL)$$, 'MR314', NULL,
    'the deprecated keyed form: a short key is MR314');

-- Relay passwords (issue 20.4): the claim returns the ciphertext; only the sender's private key opens it
\ir fixtures/sender_key.sql
SELECT mailroom.set_sender_public_key((SELECT public_key FROM sender_key));
SELECT mailroom.upsert_sender('authed', 'robot@mailroom.test', 'relay.example.net', 587, 'starttls', 'robot', 'pa55 word');
SELECT mailroom.upsert_sender('local', 'robot@mailroom.test', '127.0.0.1', 2525, 'none', 'robot', 'l0cal',
    p_allow_cleartext => true);
SELECT mailroom.enqueue_message(s, ARRAY['p@example.com'], 'pw ' || s, 't') FROM unnest(ARRAY['authed', 'local']) AS s;
CREATE TEMP TABLE c3 ON COMMIT DROP AS
SELECT * FROM mailroom.claim_messages(100, 'pw') WHERE subject LIKE 'pw %';
SELECT results_eq(
    $$ SELECT sender_name, smtp_username, smtp_password_set, smtp_allow_cleartext,
           pgp_pub_decrypt(smtp_password_sealed, (SELECT secret_key FROM sender_key))
       FROM c3 ORDER BY sender_name $$,
    $$ VALUES ('authed', 'robot', true, false, 'pa55 word'), ('local', 'robot', true, true, 'l0cal') $$,
    'claim returns the password sealed for the sender key (and the cleartext opt-in of a loopback relay)'
);
SELECT is(
    (SELECT count(*)::int FROM pg_proc AS p WHERE p.oid = 'mailroom.claim_messages(integer,text,interval)'::regprocedure
        AND NOT 'bytea'::regtype = ANY(p.proargtypes)),
    1, 'claim_messages takes no key'
);
-- the keyed form of the previous release: the old symmetric ciphertext, decrypted with the key it passes
UPDATE mailroom.senders
SET smtp_password_sealed = NULL,
    smtp_password_encrypted = pgp_sym_encrypt('old pw', repeat('ab', 32), 'cipher-algo=aes256, s2k-mode=1, s2k-digest-algo=sha256')
WHERE name IN ('authed', 'local');
UPDATE mailroom.outbound_messages SET status = 'queued', claim_token = NULL
WHERE subject LIKE 'pw %' AND created_at <= mailroom.clock();
SELECT results_eq(
    $$ SELECT sender_name, smtp_username, smtp_password
       FROM mailroom.claim_messages(100, 'legacy', decode(repeat('ab', 32), 'hex'), NULL)
       WHERE subject LIKE 'pw %' ORDER BY sender_name $$,
    $$ VALUES ('authed', 'robot', 'old pw'), ('local', 'robot', 'old pw') $$,
    'claim_messages(limit, worker, key, lease) (deprecated) decrypts the previous release''s ciphertext'
);
UPDATE mailroom.senders SET smtp_allow_cleartext = false WHERE name = 'local';
UPDATE mailroom.outbound_messages SET status = 'queued', claim_token = NULL
WHERE subject LIKE 'pw %' AND created_at <= mailroom.clock();
SELECT results_eq(
    $$ SELECT sender_name, smtp_username, smtp_password
       FROM mailroom.claim_messages(100, 'legacy', decode(repeat('ab', 32), 'hex'), NULL)
       WHERE subject LIKE 'pw %' ORDER BY sender_name $$,
    $$ VALUES ('authed', 'robot', 'old pw'), ('local', NULL, NULL) $$,
    'and gives no credentials for a cleartext relay that was not allowed (an older sender would log in over it)'
);


SELECT isnt(
    obj_description('mailroom.claim_messages(integer,text,interval)'::regprocedure), NULL,
    'claim_messages is documented'
);

-- A batch comes back in the order it is claimed in (issue 34): priority first, then due order,
-- whichever plan runs (the cached generic one at 50, a custom one at 200); the test's earlier rows
-- are all claimed by now
SELECT mailroom.enqueue_message('tap', ARRAY['p@example.com'], 'p' || p, 't', p_priority => p)
FROM unnest(ARRAY[-10, 0, 10, 3]) AS p;
SELECT is(
    (SELECT array_agg(c.subject) FROM mailroom.claim_messages(50, 'prio') AS c),  -- (in the order returned)
    ARRAY['p10', 'p3', 'p0', 'p-10'], 'a batch is returned by priority (generic plan)'
);
SELECT mailroom.release_messages(array_agg(id), array_agg(claim_token))
FROM mailroom.outbound_messages WHERE status = 'processing' AND claimed_by = 'prio' AND created_at <= mailroom.clock();
SELECT is(
    (SELECT array_agg(c.subject) FROM mailroom.claim_messages(200, 'prio') AS c),  -- (in the order returned)
    ARRAY['p10', 'p3', 'p0', 'p-10'], 'a batch is returned by priority (custom plan)'
);

-- a row is due once made: a claim pinned before its created_at never takes it (nor locks it), so
-- db verify's files, pinned before any installation existed, meet their own rows alone
SET LOCAL mailroom.clock = '2000-01-02 00:00Z';
SELECT mailroom.enqueue_message('tap', ARRAY['made@example.com'], 'made later', 't') AS made \gset
SET LOCAL mailroom.clock = '2000-01-01 12:00Z';
SELECT is(
    (SELECT count(*)::integer FROM mailroom.claim_messages(100, 'early') WHERE id = :made), 0,
    'a message is not due before it was made (created_at <= clock)'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.claim_messages(100, 'early') WHERE created_at > mailroom.clock()), 0,
    'nor any row made after the clock'
);
SET LOCAL mailroom.clock = '2000-01-02 00:00Z';
SELECT is(
    (SELECT count(*)::integer FROM mailroom.claim_messages(100, 'made') WHERE id = :made), 1, 'and it is once made'
);

-- the claim's row, one definition (issue 36): every form of the claim returns mailroom.claimed_message
SELECT is(
    (SELECT string_agg(p.oid::regprocedure::text || ' ' || p.proretset || ' ' || format_type(p.prorettype, NULL), '; '
        ORDER BY p.oid::regprocedure::text)
     FROM pg_proc AS p
     WHERE p.oid IN ('mailroom_internal._claim(timestamptz, integer, text, interval, boolean)'::regprocedure,
                     'mailroom.claim_messages(integer, text, interval)'::regprocedure)),
    'mailroom.claim_messages(integer,text,interval) true mailroom.claimed_message; '
    'mailroom_internal._claim(timestamp with time zone,integer,text,interval,boolean) true mailroom.claimed_message',
    '_claim and claim_messages return SETOF mailroom.claimed_message'
);

SELECT * FROM finish();
ROLLBACK;
