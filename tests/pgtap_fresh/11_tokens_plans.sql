-- Tokens: the plans of the dequeue (tests/pgtap/11_tokens.sql has the rest). On the test cluster only
-- (tests/pgtap_fresh: never shipped, never run by db verify): it dispatches every pending token, runs
-- ANALYZE (its row estimates survive the ROLLBACK) and drops and recreates the pending indexes.
BEGIN;
SELECT plan(6);
\ir ../pgtap/fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE k (key bytea);
INSERT INTO k VALUES (decode(repeat('cafebabe', 8), 'hex'));

-- EXPLAIN the very statement dequeue_tokens executes, with 5,000 processed
-- tokens and statistics, as a custom plan (what EXECUTE ... USING gets)
INSERT INTO mailroom.accounts (email, login)
SELECT 'old' || g || '@example.com', 'old' || g FROM generate_series(1, 5000) AS g;
UPDATE mailroom.tokens SET dispatched_at = mailroom.clock() WHERE dispatched_at IS NULL;
ANALYZE mailroom.tokens;
ANALYZE mailroom.accounts;
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
CREATE FUNCTION pg_temp.dequeue_plan(p_limit integer) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text;
    v_plan text := '';
BEGIN
    EXECUTE 'PREPARE dq(integer, bytea, timestamptz) AS ' || mailroom_internal._dequeue_tokens_sql(true);
    FOR r IN EXECUTE format('EXPLAIN EXECUTE dq(%s, %L, %L)', p_limit, (SELECT key FROM k), mailroom.clock()) LOOP
        v_plan := v_plan || r || E'\n';
    END LOOP;
    DEALLOCATE dq;
    RETURN v_plan;
END;
$$;
SELECT matches(split_part(pg_temp.dequeue_plan(10), 'CTE closed', 1), 'Index Scan using tokens_(p[0-9]{8}t[0-9]{4}|default)_pending_idx on tokens',
    'dequeue at limit 10 scans the partial index');
SELECT matches(split_part(pg_temp.dequeue_plan(1000), 'CTE closed', 1), 'Index Scan using tokens_(p[0-9]{8}t[0-9]{4}|default)_pending_idx on tokens',
    'dequeue at limit 1000 scans the partial index');
SELECT is(pg_temp.nonempty_seq_scans(pg_temp.dequeue_plan(1000)), NULL, 'and never a sequential scan of tokens');
SELECT matches(split_part(split_part(pg_temp.dequeue_plan(100), 'CTE closed', 2), 'CTE minted', 1), 'Index Scan using tokens_(p[0-9]{8}t[0-9]{4}|default)_pending_expiry_idx on tokens',
    'expired pending tokens are found through tokens_pending_expiry_idx');

-- each pending index can serve only its own query, whatever the estimates
SET CONSTRAINTS ALL IMMEDIATE;  -- fire the deferred FK checks before touching indexes
DROP INDEX mailroom.tokens_pending_idx;
SELECT doesnt_match(split_part(pg_temp.dequeue_plan(100), 'CTE closed', 1), '_pending_expiry_idx',
    'the expiry index cannot serve the due-query (its predicate is not implied)');
DROP INDEX mailroom.tokens_pending_expiry_idx;
CREATE INDEX tokens_pending_idx ON mailroom.tokens (id)
WHERE dispatched_at IS NULL AND consumed_at IS NULL AND revoked_at IS NULL AND expires_at > '-infinity';
SELECT mailroom_internal._name_partition_indexes('tokens');  -- its partitions' copies: tokens_<partition>_pending_idx
SELECT doesnt_match(split_part(split_part(pg_temp.dequeue_plan(100), 'CTE closed', 2), 'CTE minted', 1), '_pending_idx',
    'the due-query index cannot serve the expiry sweep');

SELECT * FROM finish();
ROLLBACK;
