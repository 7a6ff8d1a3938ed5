-- Email addresses: one validator for every area, so an address accepted anywhere
-- (an account's email, a recipient) is one the outbound queue can send to.

CREATE OR REPLACE FUNCTION mailroom._is_valid_address(p_address text)
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

COMMENT ON FUNCTION mailroom._is_valid_address(text) IS
'Internal: an RFC 5321 mailbox (dot-atom local part, LDH domain, length limits).';

CREATE OR REPLACE FUNCTION mailroom._is_domain_name(p_domain text)
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

COMMENT ON FUNCTION mailroom._is_domain_name(text) IS
'Internal: whether a lower-case string is a domain name (LDH labels of 1-63 characters, at most 253 octets).';

-- Plus-addressing (docs/inboxes.md): mail to box+tag@domain is mail for box@domain, tagged tag. Both
-- take an address in its stored form (mailroom._normalize_address: lower case, trimmed). The split is
-- at the first '+' of the local part; a local part starting with '+' is not split (no box before it).
CREATE OR REPLACE FUNCTION mailroom._address_base(p_address text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_at integer := strpos(p_address, '@');
    v_plus integer := strpos(p_address, '+');
BEGIN
    -- on the RCPT path: two strpos, no regular expression, the address itself when it has no tag
    IF v_plus <= 1 OR v_at = 0 OR v_plus > v_at THEN
        RETURN p_address;
    END IF;
    RETURN left(p_address, v_plus - 1) || substr(p_address, v_at);
END;
$fn$;

COMMENT ON FUNCTION mailroom._address_base(text) IS
'Internal: the address without its plus tag (box+tag@domain: box@domain), the address itself when it has none.';

CREATE OR REPLACE FUNCTION mailroom._address_tag(p_address text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_at integer := strpos(p_address, '@');
    v_plus integer := strpos(p_address, '+');
    v_tag text;
BEGIN
    -- the tag of box+tag@domain when it is a valid tag (1-64 of [a-z0-9._-]: mailroom._message_tags);
    -- NULL without one, or when what follows the '+' is no tag (box+a+b@, box+@): the mail is still
    -- box's (_address_base), untagged, never refused for its tag
    IF v_plus <= 1 OR v_at = 0 OR v_plus > v_at THEN
        RETURN NULL;
    END IF;
    v_tag := substr(p_address, v_plus + 1, v_at - v_plus - 1);
    IF v_tag ~ '^[a-z0-9._-]{1,64}$' THEN
        RETURN v_tag;
    END IF;
    RETURN NULL;
END;
$fn$;

COMMENT ON FUNCTION mailroom._address_tag(text) IS
'Internal: the plus tag of an address in stored form (box+tag@domain: tag) when it is a valid tag, else NULL.';
