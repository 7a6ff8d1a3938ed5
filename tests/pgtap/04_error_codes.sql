-- The error vocabulary (sql/04_error_codes.sql, migration 0110): mailroom.error_codes holds every
-- MRnnn SQLSTATE a function of the schema raises and nothing else, each in the area of its hundreds
-- digit; the SMTP replies are the inbound server's; error_codes() reads it.
BEGIN;
SELECT plan(9);

-- every code a function raises: RAISE … ERRCODE = 'MRnnn' in the source of the schema's functions,
-- and MR002, which only install-time DO blocks raise (sql/03_crypto.sql, migration 0050) and no
-- function keeps (tests/db/test_error_codes.py reads the files of sql/ themselves)
CREATE TEMP TABLE raised ON COMMIT DROP AS
SELECT DISTINCT m[1] AS code
FROM pg_proc AS p
CROSS JOIN LATERAL regexp_matches(p.prosrc, 'ERRCODE\s*=\s*''(MR[0-9]{3})''', 'g') AS m
WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)
UNION
VALUES ('MR002');

SELECT cmp_ok((SELECT count(*)::int FROM raised), '>=', 80, 'the functions raise MR codes (the scan finds them)');
SELECT is(
    (SELECT coalesce(string_agg(r.code, ', ' ORDER BY r.code), '') FROM raised AS r
     WHERE NOT EXISTS (SELECT 1 FROM mailroom.error_codes AS e WHERE e.code = r.code)),
    '', 'every MR code a function raises is in mailroom.error_codes'
);
SELECT is(
    (SELECT coalesce(string_agg(e.code, ', ' ORDER BY e.code), '') FROM mailroom.error_codes AS e
     WHERE NOT EXISTS (SELECT 1 FROM raised AS r WHERE r.code = e.code)),
    '', 'every row of mailroom.error_codes is raised by some function (no stale code)'
);
SELECT throws_ok(
    $$INSERT INTO mailroom.error_codes (code, area, kind, meaning) VALUES ('MR299', 'outbound', 'usage', 'x')$$,
    '23514', NULL, 'a code outside its area''s range is refused (MR2nn is inboxes)'
);
SELECT throws_ok(
    $$INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply) VALUES ('MR299', 'inboxes', 'usage', 'x', '250 ok')$$,
    '23514', NULL, 'an SMTP reply must be a 4xx or 5xx reply with an enhanced code'
);
SELECT is(
    (SELECT array_agg(verdict ORDER BY verdict) FROM mailroom.error_codes WHERE verdict IS NOT NULL),
    ARRAY['deleted', 'expired', 'full', 'too_large', 'unknown'],
    'every refusing verdict of check_recipient has its code and reply'
);
SELECT is(mailroom_internal._verdict_reply('too_large'), '552 5.3.4 Message too big for this mailbox', 'the reply of a verdict');
SELECT is(mailroom_internal._verdict_reply('ok'), NULL, 'ok has no refusal reply');
SELECT results_eq(
    'SELECT code, kind FROM mailroom.error_codes() WHERE code IN (''MR001'', ''MR207'')',
    $$VALUES ('MR001', 'usage'), ('MR207', 'limit')$$,
    'error_codes() reads the vocabulary'
);

SELECT * FROM finish();
ROLLBACK;
