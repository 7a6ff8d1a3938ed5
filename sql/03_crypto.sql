-- Cryptography: every call into pgcrypto goes through these wrappers. They name the schema
-- pgcrypto is installed in (looked up when this file runs), so no mailroom function depends on
-- the caller's search_path to find hmac() or digest().

DO $crypto$
DECLARE
    v_schema text := (
        SELECT e.extnamespace::pg_catalog.regnamespace::text
        FROM pg_catalog.pg_extension AS e
        WHERE e.extname = 'pgcrypto'
    );
BEGIN
    -- The per-row wrappers are PL/pgSQL: a SQL function with SET search_path is parsed and planned
    -- again at every statement that calls it (~10 us); they run several times per account insert.
    IF v_schema IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR002',
            MESSAGE = 'the pgcrypto extension is not installed in this database',
            HINT = 'CREATE EXTENSION pgcrypto (a trusted extension: the database owner may create it).';
    END IF;
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION mailroom_internal._random_bytes(p_count integer)
        RETURNS bytea
        LANGUAGE plpgsql
        VOLATILE
        STRICT
        PARALLEL SAFE
        SET search_path = pg_catalog, pg_temp
        AS 'BEGIN RETURN %1$s.gen_random_bytes(p_count); END'
    $f$, v_schema);
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION mailroom_internal._digest(p_data bytea, p_algorithm text)
        RETURNS bytea
        LANGUAGE plpgsql
        IMMUTABLE
        STRICT
        PARALLEL SAFE
        SET search_path = pg_catalog, pg_temp
        AS 'BEGIN RETURN %1$s.digest(p_data, p_algorithm); END'
    $f$, v_schema);
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION mailroom_internal._hmac(p_data bytea, p_key bytea, p_algorithm text)
        RETURNS bytea
        LANGUAGE plpgsql
        IMMUTABLE
        STRICT
        PARALLEL SAFE
        SET search_path = pg_catalog, pg_temp
        AS 'BEGIN RETURN %1$s.hmac(p_data, p_key, p_algorithm); END'
    $f$, v_schema);
    -- Many HMACs in one call (one query for the whole array): a per-row call of _hmac costs a
    -- SQL-function executor start each (~10 us), more than the HMAC itself.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION mailroom_internal._hmac_many(p_data bytea [], p_key bytea, p_algorithm text)
        RETURNS bytea []
        LANGUAGE sql
        IMMUTABLE
        STRICT
        PARALLEL SAFE
        SET search_path = pg_catalog, pg_temp
        AS 'SELECT coalesce(array_agg(%1$s.hmac(u.d, p_key, p_algorithm) ORDER BY u.n), ''{}'')
            FROM unnest(p_data) WITH ORDINALITY AS u (d, n)'
    $f$, v_schema);
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION mailroom_internal._pgp_sym_encrypt(p_data text, p_password text, p_options text)
        RETURNS bytea
        LANGUAGE sql
        VOLATILE
        STRICT
        PARALLEL SAFE
        SET search_path = pg_catalog, pg_temp
        AS 'SELECT %1$s.pgp_sym_encrypt(p_data, p_password, p_options)'
    $f$, v_schema);
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION mailroom_internal._pgp_sym_decrypt(p_data bytea, p_password text)
        RETURNS text
        LANGUAGE sql
        IMMUTABLE
        STRICT
        PARALLEL SAFE
        SET search_path = pg_catalog, pg_temp
        AS 'SELECT %1$s.pgp_sym_decrypt(p_data, p_password)'
    $f$, v_schema);
    -- public-key encryption for the sender keypair (relay passwords): the private half is never here
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION mailroom_internal._pgp_pub_encrypt(p_data text, p_key bytea, p_options text)
        RETURNS bytea
        LANGUAGE sql
        VOLATILE
        STRICT
        PARALLEL SAFE
        SET search_path = pg_catalog, pg_temp
        AS 'SELECT %1$s.pgp_pub_encrypt(p_data, p_key, p_options)'
    $f$, v_schema);
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION mailroom_internal._pgp_key_id(p_data bytea)
        RETURNS text
        LANGUAGE sql
        IMMUTABLE
        STRICT
        PARALLEL SAFE
        SET search_path = pg_catalog, pg_temp
        AS 'SELECT %1$s.pgp_key_id(p_data)'
    $f$, v_schema);
END;
$crypto$;

COMMENT ON FUNCTION mailroom_internal._random_bytes(integer) IS
'Internal: p_count bytes from pgcrypto''s CSPRNG (gen_random_bytes, schema-qualified).';

COMMENT ON FUNCTION mailroom_internal._digest(bytea, text) IS
'Internal: pgcrypto digest(), schema-qualified.';

COMMENT ON FUNCTION mailroom_internal._hmac(bytea, bytea, text) IS
'Internal: pgcrypto hmac(), schema-qualified.';

COMMENT ON FUNCTION mailroom_internal._hmac_many(bytea[], bytea, text) IS
'Internal: pgcrypto hmac() of every element (same order), schema-qualified; one call for a batch.';

COMMENT ON FUNCTION mailroom_internal._pgp_sym_encrypt(text, text, text) IS
'Internal: pgcrypto pgp_sym_encrypt(), schema-qualified.';

COMMENT ON FUNCTION mailroom_internal._pgp_sym_decrypt(bytea, text) IS
'Internal: pgcrypto pgp_sym_decrypt(), schema-qualified.';

COMMENT ON FUNCTION mailroom_internal._pgp_pub_encrypt(text, bytea, text) IS
'Internal: pgcrypto pgp_pub_encrypt(), schema-qualified.';

COMMENT ON FUNCTION mailroom_internal._pgp_key_id(bytea) IS
'Internal: pgcrypto pgp_key_id() (the key id a public key or an encrypted message names), schema-qualified.';
