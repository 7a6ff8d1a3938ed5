-- Outbound: the claim's plan at any queue size (tests/pgtap/33_outbound_claim.sql has the rest). On the
-- test cluster only (tests/pgtap_fresh: never shipped, never run by db verify): it runs ANALYZE, whose row
-- estimates are written in place and survive the ROLLBACK, and inserts 200k rows.
BEGIN;
SELECT plan(8);
\ir ../pgtap/fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);
SELECT mailroom.enqueue_message('tap', ARRAY['a' || g || '@example.com'], 's' || g, 't') FROM generate_series(1, 5) AS g;

-- The plan: an ordered scan of the partial index that stops after LIMIT rows, at any size.
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
SELECT ok(
    (SELECT string_agg(p, E'\n') FROM mailroom_internal._explain_claim(10) AS p) ~ 'Index Scan using outbound_messages_(p[0-9]{8}t[0-9]{4}|default)_due_idx',
    'small queue: the claim scans outbound_messages_due_idx'
);
ANALYZE mailroom.outbound_messages;
-- 200k rows: mostly sent history, 50k queued (half of them waiting for a retry), stats stale
INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id, status, next_retry_at, sent_at)
SELECT
    (SELECT id FROM mailroom.senders WHERE name = 'tap'), ARRAY['bulk@example.com'], 'bulk', 't', '<b' || g || '@x>',
    CASE WHEN g % 4 = 0 THEN 'queued' ELSE 'sent' END::mailroom.outbound_status,
    CASE WHEN g % 8 = 0 THEN '2031-01-01Z'::timestamptz END,
    CASE WHEN g % 4 <> 0 THEN '2029-01-01Z'::timestamptz END
FROM generate_series(1, 200000) AS g;
SELECT ok(
    (SELECT string_agg(p, E'\n') FROM mailroom_internal._explain_claim(100) AS p) ~ 'Index Scan using outbound_messages_(p[0-9]{8}t[0-9]{4}|default)_due_idx',
    '200k rows, stale statistics: still the partial index'
);
ANALYZE mailroom.outbound_messages;
SELECT ok(
    (SELECT string_agg(p, E'\n') FROM mailroom_internal._explain_claim(500) AS p) ~ 'Index Scan using outbound_messages_(p[0-9]{8}t[0-9]{4}|default)_due_idx',
    '200k rows, fresh statistics, LIMIT 500: still the partial index'
);
SELECT is(
    pg_temp.nonempty_seq_scans((SELECT string_agg(p, E'\n') FROM mailroom_internal._explain_claim(10000) AS p)), NULL,
    'LIMIT 10000: no sequential scan of the queue'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.claim_messages(500, 'big')), 500,
    'the big claim returns a full batch'
);
-- claim_messages up to LIMIT 100 runs the claim statement (_claim) with its cached generic plan
-- (no LIMIT, no clock known) under the settings claim_messages sets for it: the same shape at 200k rows
CREATE TEMP TABLE generic_plan (line text) ON COMMIT DROP;
SET LOCAL plan_cache_mode = force_generic_plan;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_sort = off;
SET LOCAL enable_hashjoin = off;
SET LOCAL enable_mergejoin = off;
SET LOCAL jit = off;
CREATE FUNCTION pg_temp.explain_generic() RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE 'PREPARE claim_generic (timestamptz, integer, text, interval, boolean) AS '
        || mailroom_internal._statement_of('mailroom_internal._claim(timestamptz, integer, text, interval, boolean)'::regprocedure);
    RETURN QUERY EXECUTE 'EXPLAIN EXECUTE claim_generic(mailroom.clock(), 100, ''w'', interval ''5 minutes'', false)';
END;
$$;
INSERT INTO generic_plan SELECT p FROM pg_temp.explain_generic() AS p;
DEALLOCATE claim_generic;
RESET plan_cache_mode;
RESET enable_seqscan;
RESET enable_bitmapscan;
RESET enable_sort;
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET jit;
SELECT ok(
    (SELECT string_agg(line, E'\n') FROM generic_plan) ~ 'Index Scan using outbound_messages_(p[0-9]{8}t[0-9]{4}|default)_due_idx'
    AND (SELECT string_agg(line, E'\n') FROM generic_plan) ~ 'Index Cond: \(COALESCE\(next_retry_at.*<= mailroom\.clock\(\)\)',
    'the cached generic plan walks outbound_messages_due_idx (bounded by the clock)'
);
SELECT is(
    pg_temp.nonempty_seq_scans((SELECT string_agg(line, E'\n') FROM generic_plan)), NULL,
    'the cached generic plan never scans the queue sequentially'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.claim_messages(100, 'cached')), 100,
    'a claim through the cached plan returns a full batch'
);
SELECT * FROM finish();
ROLLBACK;
