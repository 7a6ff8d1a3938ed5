-- The public API documents itself: every function in schema mailroom has a COMMENT
-- (so `\df+ mailroom.*` is the reference), and each public one names the errors it raises: every
-- MRnnn its own body raises stands in its comment, by itself or in a range (MR110-MR120).
BEGIN;
SELECT plan(4);

SELECT is(
    (
        SELECT coalesce(string_agg(p.oid::regprocedure::text, ', ' ORDER BY p.proname), '')
        FROM pg_proc AS p
        INNER JOIN pg_namespace AS n ON p.pronamespace = n.oid
        WHERE n.nspname = 'mailroom' AND obj_description(p.oid, 'pg_proc') IS NULL
    ),
    '',
    'every function in schema mailroom has a COMMENT ON FUNCTION'
);

SELECT cmp_ok(
    (
        SELECT count(*)::int
        FROM pg_proc AS p
        INNER JOIN pg_namespace AS n ON p.pronamespace = n.oid
        WHERE n.nspname = 'mailroom' AND p.proname !~ '^(_|trg_)'
    ),
    '>=',
    40,
    'the public API (functions not named _* or trg_*) is all there'
);

SELECT is(
    (
        SELECT coalesce(string_agg(p.proname, ', ' ORDER BY p.proname), '')
        FROM pg_proc AS p
        INNER JOIN pg_namespace AS n ON p.pronamespace = n.oid
        WHERE
            n.nspname = 'mailroom'
            AND p.proname ~ '^_'
            AND obj_description(p.oid, 'pg_proc') !~* '^internal'
    ),
    '',
    'internal helpers (_*) say so in their comment'
);

SELECT is(
    (
        SELECT coalesce(string_agg(p.proname || ' ' || r.code, ', ' ORDER BY p.proname, r.code), '')
        FROM pg_proc AS p
        CROSS JOIN LATERAL (
            SELECT DISTINCT m[1] AS code
            FROM regexp_matches(p.prosrc, 'ERRCODE\s*=\s*''(MR[0-9]{3})''', 'g') AS m
        ) AS r
        WHERE
            p.pronamespace = 'mailroom'::regnamespace
            AND p.proname !~ '^(_|trg_)'
            AND position(r.code IN coalesce(obj_description(p.oid, 'pg_proc'), '')) = 0
            AND NOT EXISTS (
                SELECT 1
                FROM regexp_matches(
                    coalesce(obj_description(p.oid, 'pg_proc'), ''), 'MR([0-9]{3})\s*[-–]\s*MR([0-9]{3})', 'g'
                ) AS x
                WHERE substr(r.code, 3)::int BETWEEN x[1]::int AND x[2]::int
            )
    ),
    '',
    'every public function names in its comment each MR code it raises'
);

SELECT * FROM finish();
ROLLBACK;
