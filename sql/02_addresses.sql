-- Email addresses: one validator for every area, so an address accepted anywhere
-- (an account's email, a recipient) is one the outbound queue can send to.

CREATE OR REPLACE FUNCTION mailroom_internal._is_valid_address(p_address text)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    -- ASCII dot-atom local part @ LDH domain (RFC 5321 mailbox without quoted strings
    -- or address literals); at most 64 + 1 + 253 characters.
    -- PL/pgSQL, not SQL: a SQL function with SET search_path is never inlined and is parsed and
    -- planned again at every statement that calls it (~30 us), a PL/pgSQL one once a session.
    RETURN coalesce(
        octet_length(p_address) <= 254
        AND p_address ~ $re$^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+([.][A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?([.][A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$$re$
        AND octet_length(split_part(p_address, '@', 1)) <= 64,
        FALSE
    );
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._is_valid_address(text) IS
'Internal: an RFC 5321 mailbox (dot-atom local part, LDH domain, length limits).';

CREATE OR REPLACE FUNCTION mailroom_internal._is_domain_name(p_domain text)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    -- A domain name in the stored (lower case) form: LDH labels of 1 to 63 characters, at most
    -- 253 octets; the same LDH rule _is_valid_address applies to an address's domain. The one
    -- check for bounce domains (sql/26) and domain limit patterns (sql/39).
    RETURN coalesce(
        octet_length(p_domain) <= 253
        AND p_domain ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?([.][a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$',
        FALSE
    );
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._is_domain_name(text) IS
'Internal: whether a lower-case string is a domain name (LDH labels of 1-63 characters, at most 253 octets).';
