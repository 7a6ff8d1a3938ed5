-- The public API documents itself: every function in schema mailroom has a COMMENT
-- (so `\df+ mailroom.*` is the reference), and each public one names its errors or result.
BEGIN;
SELECT plan(3);

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

SELECT * FROM finish();
ROLLBACK;
