-- Queue health: the plan of every due-count, its partial index at size (tests/pgtap/06_queue_health.sql has
-- the rest). On the test cluster only (tests/pgtap_fresh: never shipped, never run by db verify): it runs
-- ANALYZE, whose row estimates are written in place and survive the ROLLBACK.
BEGIN;
SELECT plan(6);
\ir ../pgtap/fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-03 00:01:00+00';
SELECT mailroom.upsert_sender('qh', 'robot@mailroom.test', '127.0.0.1', 2525);

-- ---------------------------------------------------------------- the plan: partial indexes only
-- history in every table (sent messages, dispatched tokens, closed inboxes) and a small backlog
INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id, status, sent_at)
SELECT (SELECT id FROM mailroom.senders WHERE name = 'qh'), ARRAY['bulk@example.com'], 'bulk', 't', '<qh' || g || '@x>',
    CASE WHEN g % 500 = 0 THEN 'queued' ELSE 'sent' END::mailroom.outbound_status, '2029-01-01Z'
FROM generate_series(1, 50000) AS g;
INSERT INTO mailroom.accounts (email, login) SELECT 'hist' || g || '@example.com', 'hist' || g FROM generate_series(1, 20000) AS g;
UPDATE mailroom.tokens SET dispatched_at = mailroom.clock(), secret = NULL, code = NULL
WHERE dispatched_at IS NULL AND id % 200 <> 0;
INSERT INTO mailroom.mailboxes (address, plan, session_token_digest, expires_at, created_at, is_active, inactive_since)
SELECT format('old-%s@qh.test', g), 'free', '\x00', '2029-01-01Z', '2029-01-01Z', g % 400 = 0,
    CASE WHEN g % 400 <> 0 THEN '2029-01-01Z'::timestamptz END
FROM generate_series(1, 50000) AS g;
ANALYZE mailroom.outbound_messages;
ANALYZE mailroom.tokens;
ANALYZE mailroom.accounts;
ANALYZE mailroom.mailboxes;
-- outbound_messages, messages and tokens are partitioned by time (migration 0100): a plan names a
-- partition's index, <partition>_<index name without the table prefix>, and an empty partition
-- (created ahead) or one of a few rows may be planned as a Seq Scan, cheaper than an index
-- descent. This lists the sequential scans of relations larger than 8 pages (64 kB).
CREATE FUNCTION pg_temp.nonempty_seq_scans(p_plan text) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(DISTINCT m[1], ', ')
    FROM regexp_matches(p_plan, 'Seq Scan on (\w+)', 'g') AS m
    WHERE EXISTS (
        SELECT 1 FROM pg_class AS c
        WHERE c.relname = m[1] AND c.relnamespace = 'mailroom'::regnamespace AND pg_relation_size(c.oid) > 8 * 8192
    )
$$;
CREATE TEMP TABLE plan ON COMMIT DROP AS SELECT string_agg(p, E'\n') AS p FROM mailroom_internal._explain_queue_health() AS p;
SELECT ok((SELECT p FROM plan) ~ 'using outbound_messages_(p[0-9]{8}t[0-9]{4}|default)_due_idx', 'outbound due-count: outbound_messages_due_idx');
SELECT ok((SELECT p FROM plan) ~ 'using outbound_messages_(p[0-9]{8}t[0-9]{4}|default)_processing(_domain)?_idx', 'expired leases: a partial index of the processing rows (outbound_messages_processing_idx or _processing_domain_idx)');
SELECT ok((SELECT p FROM plan) ~ 'using tokens_(p[0-9]{8}t[0-9]{4}|default)_pending_idx', 'tokens due-count: tokens_pending_idx');
SELECT ok((SELECT p FROM plan) ~ 'using mailboxes_expiry_idx', 'inbox_expiry due-count: mailboxes_expiry_idx');
SELECT is(pg_temp.nonempty_seq_scans((SELECT p FROM plan)), NULL, 'no sequential scan of any queue table');
SELECT results_eq(
    'SELECT queue, due FROM mailroom.queue_health()',
    $$VALUES ('outbound', 100::bigint), ('tokens', 100), ('inbox_expiry', 125)$$,
    'the counts at size'
);

SELECT * FROM finish();
ROLLBACK;
