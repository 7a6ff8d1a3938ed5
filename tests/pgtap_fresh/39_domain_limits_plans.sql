-- Outbound domain limits: the claim's plan with limits on over 200k rows (tests/pgtap/39_domain_limits.sql
-- has the rest). On the test cluster only (tests/pgtap_fresh: never shipped, never run by db verify): it
-- runs ANALYZE, whose row estimates survive the ROLLBACK.
BEGIN;
SELECT plan(3);
\ir ../pgtap/fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:10:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);

-- ---------------------------------------------------------------- the plan with limits on
-- outbound_messages is partitioned by time (migration 0100): a plan names a partition's index,
-- <partition>_<index name without the table prefix>; an empty partition (created ahead) or a tiny
-- one may be planned as a Seq Scan, cheaper than an index descent. This lists the sequential scans
-- of relations larger than 8 pages (64 kB), as in 33_outbound_claim.
CREATE FUNCTION pg_temp.nonempty_seq_scans(p_plan text) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(DISTINCT m[1], ', ')
    FROM regexp_matches(p_plan, 'Seq Scan on (\w+)', 'g') AS m
    WHERE EXISTS (
        SELECT 1 FROM pg_class AS c
        WHERE c.relname = m[1] AND c.relnamespace = 'mailroom'::regnamespace AND pg_relation_size(c.oid) > 8 * 8192
    )
$$;
-- 200k rows (mostly sent history, 50k queued over 500 domains), one capped domain full
SELECT mailroom.set_domain_limit('d1.bulk.test', 1, NULL);
INSERT INTO mailroom.outbound_messages (
    sender_id, to_addrs, subject, text_body, message_id, status, next_retry_at, sent_at, rcpt_domain
)
SELECT
    (SELECT id FROM mailroom.senders WHERE name = 'tap'), ARRAY['bulk@d' || g % 500 || '.bulk.test'], 'bulk', 't',
    '<b' || g || '@x>',
    CASE WHEN g % 4 = 0 THEN 'queued' ELSE 'sent' END::mailroom.outbound_status,
    CASE WHEN g % 8 = 0 THEN '2031-01-01Z'::timestamptz END,
    CASE WHEN g % 4 <> 0 THEN '2029-01-01Z'::timestamptz END,
    'd' || g % 500 || '.bulk.test'
FROM generate_series(1, 200000) AS g;
ANALYZE mailroom.outbound_messages;
SELECT ok(
    (SELECT string_agg(p, E'\n') FROM mailroom_internal._explain_claim(100, TRUE) AS p)
    ~ 'Index Scan using outbound_messages_(p[0-9]{8}t[0-9]{4}|default)_due_idx',
    'with limits on, LIMIT 100: the claim still walks the due index'
);
SELECT is(
    pg_temp.nonempty_seq_scans((SELECT string_agg(p, E'\n') FROM mailroom_internal._explain_claim(500, TRUE) AS p)), NULL,
    'with limits on, LIMIT 500: no sequential scan of the queue'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.claim_messages(100, 'big')), 100,
    'with limits on, a big claim returns a full batch'
);

SELECT * FROM finish();
ROLLBACK;
