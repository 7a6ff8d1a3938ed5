-- The operator's queue: the claim still walks the due index in order, priority first, over 50k rows
-- (tests/pgtap/37_outbound_queue.sql has the rest). On the test cluster only (tests/pgtap_fresh: never
-- shipped, never run by db verify): it runs ANALYZE, whose row estimates survive the ROLLBACK.
BEGIN;
SELECT plan(5);
\ir ../pgtap/fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
SELECT mailroom.upsert_sender('q', 'robot@mailroom.test', '127.0.0.1', 2525);

-- the claim still walks the due index in order, priority first, bounded by the clock
CREATE FUNCTION pg_temp.nonempty_seq_scans(p_plan text) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(DISTINCT m[1], ', ')
    FROM regexp_matches(p_plan, 'Seq Scan on (\w+)', 'g') AS m
    WHERE EXISTS (
        SELECT 1 FROM pg_class AS c
        WHERE c.relname = m[1] AND c.relnamespace = 'mailroom'::regnamespace AND pg_relation_size(c.oid) > 8 * 8192
    )
$$;
INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id, status, sent_at, priority)
SELECT (SELECT id FROM mailroom.senders WHERE name = 'q'), ARRAY['bulk@example.com'], 'bulk', 't', '<q' || g || '@x>',
    CASE WHEN g % 10 = 0 THEN 'queued' ELSE 'sent' END::mailroom.outbound_status, '2029-01-01Z', (g % 21) - 10
FROM generate_series(1, 50000) AS g;
ANALYZE mailroom.outbound_messages;
CREATE TEMP TABLE claim_plan AS SELECT string_agg(p, E'\n') AS p FROM mailroom_internal._explain_claim(10) AS p;
SELECT ok((SELECT p FROM claim_plan) ~ 'Index Scan using outbound_messages_(p[0-9]{8}t[0-9]{4}|default)_due_idx',
    'the claim scans outbound_messages_due_idx');
SELECT ok((SELECT p FROM claim_plan) ~ 'Sort Key: m\.priority DESC, \(COALESCE\(m\.next_retry_at',
    'in the index''s order (priority first): a merge of ordered scans, no sort of the due rows');
SELECT ok((SELECT p FROM claim_plan) ~ 'Index Cond: \(COALESCE\(next_retry_at.*<=',
    'the clock bounds the index scan');
SELECT is(pg_temp.nonempty_seq_scans((SELECT p FROM claim_plan)), NULL, 'no sequential scan of the queue');
SELECT is(pg_temp.nonempty_seq_scans((SELECT string_agg(p, E'\n') FROM mailroom_internal._explain_claim(10, true) AS p)), NULL,
    'nor with domain limits on');

SELECT * FROM finish();
ROLLBACK;
