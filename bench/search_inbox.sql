-- Search over one inbox of 1,000 messages (issue 35 item 2; figures in docs/inboxes.md#search):
-- python -m mailroom.testing pgtap bench/search_inbox.sql   (the NOTICE lines are the figures; ~3 min)
BEGIN;
SELECT plan(1);
INSERT INTO mailroom.plans (name, default_ttl_minutes, max_ttl_minutes, max_message_bytes, max_messages)
VALUES ('bench', 1440, 10080, 26214400, 2000000000) ON CONFLICT (name) DO NOTHING;
CREATE TEMP TABLE b AS SELECT * FROM mailroom.create_mailbox(60, 'bench');
-- 1,000 messages: ~1.2 kB of text each (words from a 5,000-word vocabulary), one in 4 as HTML only
CREATE TEMP TABLE vocab AS SELECT i, substr(md5(i::text), 1, 4 + i % 7) AS w FROM generate_series(1, 5000) AS i;
SELECT count(mailroom.deliver_message(
    (SELECT address FROM b), '\x31'::bytea, format('sender%s@shop%s.example.org', n % 50, n % 7),
    format('Invoice %s for order %s', n, n * 7), format('Shop %s <sender%s@shop%s.example.org>', n % 7, n % 50, n % 7),
    CASE WHEN n % 4 <> 0 THEN t END, CASE WHEN n % 4 = 0 THEN '<p>' || t || '</p>' END
))
FROM (
    SELECT n, (SELECT string_agg(v.w, ' ') FROM vocab AS v WHERE v.i IN (
        SELECT 1 + ((n * 7919 + k * 104729) % 5000) FROM generate_series(1, 170) AS k)) AS t
    FROM generate_series(1, 1000) AS n
) AS s;
UPDATE mailroom.messages SET is_read = (id % 3 = 0);
CREATE FUNCTION pg_temp.t(p_query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_times float8[] := '{}'; v_start timestamptz; v_n integer;
BEGIN
    FOR i IN 1..5 LOOP
        v_start := clock_timestamp();
        SELECT count(*) INTO v_n FROM mailroom.search_messages((SELECT address FROM b), (SELECT session_token FROM b), p_query, p_limit => 1000);
        v_times := v_times || extract(epoch FROM clock_timestamp() - v_start) * 1000;
    END LOOP;
    RETURN format('%-40s %5s matches  median %s ms  min %s ms', p_query, v_n,
        round((SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) FROM unnest(v_times) AS x)::numeric, 1),
        round((SELECT min(x) FROM unnest(v_times) AS x)::numeric, 1));
END $$;
CREATE FUNCTION pg_temp.report(p_label text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE q text;
BEGIN
    FOREACH q IN ARRAY ARRAY['is:unread', 'before:2000-01-01', '"invoice 500"', 'subject:invoice -is:read',
        'invoice*', 'invoice', 'shop3.example.org', 'from:example.org', (SELECT substr(w, 2, 3) FROM vocab WHERE i = 77),
        (SELECT substr(w, 1, 4) FROM vocab WHERE i = 77) || ' ' || (SELECT substr(w, 2, 4) FROM vocab WHERE i = 99)
        || ' -is:read', 'zzzzqq', 'zzzzqq yyyyqq xxxxqq wwwwqq',
        (SELECT string_agg('zz' || i || 'qq', ' ') FROM generate_series(1, 16) AS i)] LOOP
        RAISE NOTICE '% %', p_label, pg_temp.t(q);
    END LOOP;
END $$;
SELECT pg_temp.report('unindexed');
SELECT mailroom.index_messages(ARRAY(SELECT id FROM mailroom.messages));
SELECT pg_temp.report('indexed  ');
UPDATE mailroom.messages SET search_version = null;
SELECT pg_temp.report('first-def');
UPDATE mailroom.messages SET search_version = 2;
DO $$ DECLARE v_start timestamptz := clock_timestamp(); v_n int; BEGIN
  FOR i IN 1..7 LOOP
  SELECT count(*) INTO v_n FROM mailroom.messages g WHERE g.mailbox_id = (SELECT mailbox_id FROM b) AND g.search_vector @@ websearch_to_tsquery('simple', 'invoice');
  END LOOP;
  RAISE NOTICE 'reference: the old rule (websearch tsquery @@ the stored vector): % matches, % ms', v_n, round((extract(epoch FROM clock_timestamp() - v_start) * 1000 / 7)::numeric, 1);
END $$;
DO $$ DECLARE v_start timestamptz := clock_timestamp(); v_n int; BEGIN
  UPDATE mailroom.messages SET search_version = 1;
  v_start := clock_timestamp();
  SELECT sum(rebuilt) INTO v_n FROM (SELECT (mailroom.reindex_messages(1000)).rebuilt) x;
  RAISE NOTICE 'reindex_messages(1000): % rebuilt in % ms', v_n, round((extract(epoch FROM clock_timestamp() - v_start) * 1000)::numeric, 1);
END $$;
SELECT pass('measured');
SELECT * FROM finish();
ROLLBACK;
