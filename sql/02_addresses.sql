-- Email addresses: one validator for every area, so an address accepted anywhere
-- (an account's email, a recipient) is one the outbound queue can send to.

CREATE OR REPLACE FUNCTION mailroom._is_valid_address(p_address text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
    -- ASCII dot-atom local part @ LDH domain (RFC 5321 mailbox without quoted strings
    -- or address literals); at most 64 + 1 + 253 characters.
    SELECT coalesce(
        octet_length(p_address) <= 254
        AND p_address ~ $re$^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+([.][A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?([.][A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$$re$
        AND octet_length(split_part(p_address, '@', 1)) <= 64,
        FALSE
    );
$fn$;

COMMENT ON FUNCTION mailroom._is_valid_address(text) IS
'Internal: an RFC 5321 mailbox (dot-atom local part, LDH domain, length limits).';
