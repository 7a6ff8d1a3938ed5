-- DKIM (RFC 6376, docs/deliverability.md): per sender domain (the domain of a sender's
-- from_address, so the signature aligns with From for DMARC), the selector and the public half.
-- The private key never reaches the database: it lives where `mailroom send` runs
-- (MAILROOM_DKIM_KEY_FILE); claim_messages returns the selector and public half of the From
-- domain, and the sender signs with the private key of its file that matches that public half.

CREATE OR REPLACE FUNCTION mailroom_internal._address_domain(p_address text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL, not SQL: a SQL function with SET is never inlined and is planned at every call
    -- (119 us a call in the claim, against a few in PL/pgSQL's cached expression)
    RETURN nullif(lower(split_part(p_address, '@', 2)), '');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._address_domain(text) IS
'Internal: the domain of an address in lower case (NULL without one).';

CREATE OR REPLACE FUNCTION mailroom_internal._dkim_record(p_algorithm text, p_public_key text)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the TXT record's value (RFC 6376 section 3.6.1; RFC 8463 for ed25519)
    SELECT 'v=DKIM1; k=' || CASE WHEN p_algorithm = 'ed25519-sha256' THEN 'ed25519' ELSE 'rsa' END || '; p=' || p_public_key;
$$;

COMMENT ON FUNCTION mailroom_internal._dkim_record(text, text) IS
'Internal: the DNS TXT value that publishes a DKIM public key (v=DKIM1; k=…; p=…).';

CREATE OR REPLACE FUNCTION mailroom.set_dkim_key(
    p_sender text,
    p_selector text,
    p_public_key text,
    p_algorithm text DEFAULT 'rsa-sha256'
)
RETURNS TABLE (domain text, selector text, dns_name text, dns_value text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_domain text;
    v_selector text := lower(btrim(p_selector));
    v_key text := regexp_replace(coalesce(p_public_key, ''), '\s', '', 'g');
BEGIN
    -- The DKIM key of the sender's From domain (one per domain: a new selector replaces the old
    -- one; publish the new record before, keep the old one for a while after). Returns the TXT
    -- record to publish. The public half only: no function takes a private key.
    SELECT mailroom_internal._address_domain(s.from_address) INTO v_domain
    FROM mailroom.senders AS s WHERE s.name = p_sender;
    IF v_domain IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR363',
            MESSAGE = format('unknown sender %s', coalesce(quote_literal(left(p_sender, 64)), 'NULL'));
    END IF;
    IF v_selector IS NULL
        OR v_selector !~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?([.][a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$'
        OR octet_length(v_selector) > 63 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR381',
            MESSAGE = 'a DKIM selector must be DNS labels (letters, digits, hyphens), at most 63 characters';
    END IF;
    IF p_algorithm IS NULL OR p_algorithm NOT IN ('rsa-sha256', 'ed25519-sha256')
        OR v_key !~ '^[A-Za-z0-9+/]+=*$' OR length(v_key) > 4096
        OR (p_algorithm = 'rsa-sha256' AND length(v_key) < 200)
        OR (p_algorithm = 'ed25519-sha256' AND length(v_key) <> 44) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR382',
            MESSAGE = 'a DKIM public key must be the base64 p= of an rsa-sha256 (at least 1024 bits) or ed25519-sha256 key';
    END IF;
    INSERT INTO mailroom.dkim_keys AS k (domain, selector, public_key, algorithm, created_at)
    VALUES (v_domain, v_selector, v_key, p_algorithm, mailroom.clock())
    ON CONFLICT ON CONSTRAINT dkim_keys_pkey DO UPDATE
    SET
        selector = excluded.selector,
        public_key = excluded.public_key,
        algorithm = excluded.algorithm,
        created_at = excluded.created_at;
    domain := v_domain;
    selector := v_selector;
    dns_name := v_selector || '._domainkey.' || v_domain;
    dns_value := mailroom_internal._dkim_record(p_algorithm, v_key);
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.set_dkim_key(text, text, text, text) IS
'Set the DKIM selector and public key (base64, the record''s p=) of a sender''s From domain; returns the DNS TXT record to publish. Errors: MR363 unknown sender, MR381 selector, MR382 public key.';

GRANT EXECUTE ON FUNCTION mailroom.set_dkim_key(text, text, text, text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.list_dkim_keys()
RETURNS TABLE (
    domain text, selector text, algorithm text, public_key text, dns_name text, dns_value text, created_at timestamptz
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT
        k.domain, k.selector, k.algorithm, k.public_key, k.selector || '._domainkey.' || k.domain,
        mailroom_internal._dkim_record(k.algorithm, k.public_key), k.created_at
    FROM mailroom.dkim_keys AS k
    ORDER BY k.domain;
$$;

COMMENT ON FUNCTION mailroom.list_dkim_keys() IS
'The DKIM keys by domain: selector, algorithm, public half and the DNS TXT record to publish (public data; doctor checks it against DNS).';

GRANT EXECUTE ON FUNCTION mailroom.list_dkim_keys() TO mailroom_admin, mailroom_monitor, mailroom_sender;

CREATE OR REPLACE FUNCTION mailroom.delete_dkim_key(p_domain text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- mail of that domain leaves unsigned from the next claim on
    DELETE FROM mailroom.dkim_keys AS k WHERE k.domain = lower(btrim(p_domain));
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR383',
            MESSAGE = 'no DKIM key for that domain';
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom.delete_dkim_key(text) IS
'Stop signing a domain''s mail (its DKIM row goes). Errors: MR383 no key for that domain.';

GRANT EXECUTE ON FUNCTION mailroom.delete_dkim_key(text) TO mailroom_admin;
