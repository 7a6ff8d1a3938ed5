-- The privilege model, as invariants that need no list of names: every function pins its
-- search_path, nothing in schemas mailroom and mailroom_internal is reachable by PUBLIC, the API a
-- runtime role calls runs as its owner (SECURITY DEFINER), no runtime role executes an internal
-- function or uses schema mailroom_internal, reads a table or a sequence, or creates in mailroom.
-- Which role executes which function is declared once, by the GRANT lines of sql/, and compared
-- with the catalog by tests/db/test_privileges.py (docs/architecture.md, "How grants are declared").
BEGIN;

CREATE TEMP TABLE runtime_roles AS
SELECT r.rolname AS role FROM pg_roles AS r
WHERE r.rolname ~ '^mailroom_' AND NOT r.rolcanlogin AND r.rolname <> 'mailroom_owner';

-- every function and procedure of both schemas
CREATE TEMP TABLE fns AS
SELECT
    p.oid,
    p.oid::regprocedure::text AS sig,
    p.proname AS fn,
    p.pronamespace::regnamespace::text AS schema,
    p.prosecdef,
    p.proconfig,
    p.prokind,
    p.proowner,
    EXISTS (
        SELECT 1 FROM runtime_roles AS r WHERE has_function_privilege(r.role, p.oid, 'EXECUTE')
    ) AS called
FROM pg_proc AS p
WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace);

SELECT plan(24 + 2 * (SELECT count(*)::int FROM runtime_roles));

SELECT ok((SELECT count(*) FROM runtime_roles) = 8, 'the eight runtime roles exist');
SELECT is(
    (SELECT coalesce(string_agg(sig, ', ' ORDER BY sig), '') FROM fns
     WHERE prokind <> 'p' AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY(proconfig), false)
         -- but an internal SQL helper inlined into its (pinned) caller's query, which a SET would prevent
         AND NOT (schema = 'mailroom_internal' AND NOT prosecdef AND proconfig IS NULL
                  AND (SELECT l.lanname FROM pg_proc AS p INNER JOIN pg_language AS l ON p.prolang = l.oid
                       WHERE p.oid = fns.oid) = 'sql'
                  AND obj_description(oid, 'pg_proc') LIKE 'Internal (inlined): %')),
    '', '(a) every function pins search_path = pg_catalog, pg_temp (a procedure that COMMITs cannot carry SET; '
        'an internal SQL helper marked "Internal (inlined)" runs inside its pinned caller''s query)'
);
SELECT is(
    (SELECT coalesce(string_agg(sig, ', ' ORDER BY sig), '') FROM fns
     WHERE schema = 'mailroom' AND called AND prokind <> 'p' AND NOT prosecdef),
    '', 'every function a runtime role calls is SECURITY DEFINER (procedures, which COMMIT or wait, run as the caller)'
);
SELECT is(
    (SELECT coalesce(string_agg(sig, ', ' ORDER BY sig), '') FROM fns WHERE schema = 'mailroom_internal' AND prosecdef),
    '', 'no internal function is SECURITY DEFINER (it runs with the rights of the API that calls it, never lends them)'
);
SELECT is(
    (SELECT coalesce(string_agg(sig, ', ' ORDER BY sig), '') FROM fns
     WHERE (schema = 'mailroom') = (fn ~ '^(_|trg_)')),
    '', 'internal functions (_x, trg_x) live in mailroom_internal, the API in mailroom'
);
SELECT is(
    (SELECT coalesce(string_agg(f.sig, ', ' ORDER BY f.sig), '') FROM fns AS f INNER JOIN pg_proc AS p ON f.oid = p.oid
     WHERE p.prosrc ~ '(?<![._a-z])(gen_random_bytes|digest|hmac|pgp_sym_encrypt|pgp_sym_decrypt|pgp_pub_encrypt|pgp_key_id)\('
         AND f.fn NOT IN ('_random_bytes', '_digest', '_hmac', '_hmac_many', '_pgp_sym_encrypt', '_pgp_sym_decrypt',
             '_pgp_pub_encrypt', '_pgp_key_id')),
    '', 'pgcrypto is called only through the mailroom_internal._* wrappers of sql/03_crypto.sql'
);
SELECT is(
    (SELECT coalesce(string_agg(f.sig, ', ' ORDER BY f.sig), '')
     FROM fns AS f, aclexplode(coalesce(
         (SELECT p.proacl FROM pg_proc AS p WHERE p.oid = f.oid), acldefault('f', f.proowner)
     )) AS a
     WHERE f.prosecdef AND a.grantee = 0),
    '', '(b) no SECURITY DEFINER function is executable by PUBLIC'
);
SELECT is(
    (SELECT coalesce(string_agg(f.sig, ', ' ORDER BY f.sig), '')
     FROM fns AS f, aclexplode(coalesce(
         (SELECT p.proacl FROM pg_proc AS p WHERE p.oid = f.oid), acldefault('f', f.proowner)
     )) AS a
     WHERE a.grantee = 0),
    '', '(c) no function or procedure of mailroom or mailroom_internal is executable by PUBLIC'
);
SELECT is(
    (SELECT coalesce(string_agg(f.sig, ', ' ORDER BY f.sig), '')
     FROM fns AS f, aclexplode(coalesce(
         (SELECT p.proacl FROM pg_proc AS p WHERE p.oid = f.oid), acldefault('f', f.proowner)
     )) AS a
     WHERE f.schema = 'mailroom_internal' AND a.grantee <> f.proowner),
    '', 'nothing in mailroom_internal is granted to anyone'
);
SELECT is(
    (SELECT coalesce(string_agg(r.role || ' ' || f.sig, ', ' ORDER BY f.sig, r.role), '')
     FROM fns AS f CROSS JOIN runtime_roles AS r
     WHERE f.schema = 'mailroom_internal' AND has_function_privilege(r.role, f.oid, 'EXECUTE')),
    '', 'no runtime role may execute an internal helper (_*) or a trigger function (trg_*)'
);
SELECT is(
    (SELECT coalesce(string_agg(sig, ', ' ORDER BY sig), '') FROM fns WHERE proowner <> 'mailroom_owner'::regrole),
    '', 'every function belongs to mailroom_owner'
);
SELECT is(
    (SELECT coalesce(string_agg(n.nspname, ', '), '') FROM pg_namespace AS n
     WHERE n.nspname IN ('mailroom', 'mailroom_internal') AND n.nspowner <> 'mailroom_owner'::regrole),
    '', 'both schemas belong to mailroom_owner'
);
SELECT is(
    (SELECT coalesce(string_agg(c.oid::regclass::text, ', ' ORDER BY c.oid::regclass::text), '')
     FROM pg_class AS c
     WHERE c.relnamespace = 'mailroom'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
         AND c.relowner <> 'mailroom_owner'::regrole),
    '', 'every table, view and sequence belongs to mailroom_owner'
);
SELECT is(
    (SELECT coalesce(string_agg(c.oid::regclass::text, ', '), '') FROM pg_class AS c
     WHERE c.relnamespace = 'mailroom_internal'::regnamespace),
    '', 'mailroom_internal holds functions only'
);
SELECT is(
    (SELECT coalesce(string_agg(c.relname || '.' || a.attname, ', '), '')
     FROM pg_attribute AS a INNER JOIN pg_class AS c ON a.attrelid = c.oid
     WHERE c.relnamespace = 'mailroom'::regnamespace AND a.attacl IS NOT NULL),
    '', 'no column-level grants in schema mailroom'
);
-- (e) no runtime role has any privilege on a table or a sequence (the views a role reads are
-- declared in sql/ and checked by tests/db/test_privileges.py)
SELECT is(
    (SELECT coalesce(string_agg(r.role || ' ' || c.oid::regclass::text, ', ' ORDER BY 1), '')
     FROM pg_class AS c CROSS JOIN runtime_roles AS r
     WHERE c.relnamespace = 'mailroom'::regnamespace AND c.relkind IN ('r', 'p')
         AND has_table_privilege(r.role, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')),
    '', '(e) no runtime role has any privilege on a table of mailroom'
);
SELECT is(
    (SELECT coalesce(string_agg(r.role || ' ' || c.oid::regclass::text, ', ' ORDER BY 1), '')
     FROM pg_class AS c CROSS JOIN runtime_roles AS r
     WHERE c.relnamespace = 'mailroom'::regnamespace AND c.relkind = 'S'
         AND has_sequence_privilege(r.role, c.oid, 'USAGE, SELECT, UPDATE')),
    '', '(e) no runtime role has any privilege on a sequence of mailroom'
);

-- (f) the schemas: USAGE on mailroom, nothing else (no CREATE); nothing on mailroom_internal
SELECT schema_privs_are(
    'mailroom', r.role, ARRAY['USAGE'], format('(f) %s has USAGE on schema mailroom, no CREATE', r.role)
)
FROM runtime_roles AS r
ORDER BY r.role;
SELECT schema_privs_are(
    'mailroom_internal', r.role, ARRAY[]::text [], format('(f) %s has no privilege on schema mailroom_internal', r.role)
)
FROM runtime_roles AS r
ORDER BY r.role;
SELECT ok(NOT has_schema_privilege('public', 'mailroom_internal', 'USAGE'), '(f) PUBLIC has no USAGE on mailroom_internal');

-- (g) what the application role cannot do
CREATE FUNCTION pg_temp.sqlstate_of(p_sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE p_sql;
    RETURN 'no error';
EXCEPTION
    WHEN OTHERS THEN
        RETURN SQLSTATE;
END;
$$;
SET LOCAL ROLE mailroom_app;
SELECT throws_ok($$SELECT * FROM mailroom.tokens$$, '42501', NULL, '(g) mailroom_app cannot read mailroom.tokens');
SELECT throws_ok(
    $$UPDATE mailroom.accounts SET status = 'active'$$, '42501', NULL, '(g) mailroom_app cannot update mailroom.accounts'
);
SELECT throws_ok(
    $$SELECT mailroom_internal._hmac('\x00', '\x00', 'sha256')$$, '42501', NULL, '(g) mailroom_app cannot call mailroom_internal._hmac'
);
-- (read from the catalog, never by calling it: db verify runs no file that opens a connection)
SELECT ok(
    NOT EXISTS (
        SELECT 1 FROM pg_proc AS p
        WHERE p.proname IN ('dblink', 'dblink_connect', 'dblink_exec')
          AND has_function_privilege('mailroom_app', p.oid, 'EXECUTE')
    )
    OR NOT (SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = 'mailroom_app'),
    '(g) mailroom_app cannot open a dblink connection (no dblink, or dblink refuses a role without password)'
);
SELECT throws_ok($$SELECT mailroom.set_setting('tokens.ttl', '1 hour')$$, '42501', NULL,
    '(g) mailroom_app cannot change a setting');
RESET ROLE;
SELECT ok(
    NOT has_function_privilege('mailroom_app', 'mailroom.dequeue_tokens(integer)', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_app', 'mailroom.set_setting(text, text)', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_app', 'mailroom.pin_clock(timestamptz, boolean)', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_app', 'mailroom.claim_messages(integer, text, interval)', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_app', 'mailroom_internal._redaction_tag(text)', 'EXECUTE'),
    '(d) mailroom_app cannot execute dequeue_tokens, claim_messages, set_setting, _redaction_tag, pin_clock'
);

SELECT * FROM finish();
ROLLBACK;
