-- Sending identities: upsert_sender stores the relay settings, the password encrypted with
-- pgcrypto under a key the caller passes (never stored); _smtp_password decrypts it for claim.

CREATE OR REPLACE FUNCTION mailroom._check_outbound_key(p_key bytea)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_key IS NOT NULL AND octet_length(p_key) <> 32 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR314',
            MESSAGE = format(
                'encryption key must be 32 bytes (64 hex characters), got %s bytes',
                octet_length(p_key)
            );
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION mailroom.upsert_sender(
    p_name text,
    p_from_address text,
    p_host text,
    p_port integer,
    p_security text DEFAULT 'none',
    p_username text DEFAULT null,
    p_password text DEFAULT null,
    p_key bytea DEFAULT null
)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_encrypted bytea;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR310',
            MESSAGE = 'sender name must be 1-64 characters of letters, digits, ".", "_" or "-"';
    END IF;
    IF NOT mailroom._is_valid_address(p_from_address) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR303',
            MESSAGE = format('from address of sender %s is not a valid email address', p_name);
    END IF;
    IF p_host IS NULL OR p_host !~ '^[A-Za-z0-9]([A-Za-z0-9.:_-]{0,252}[A-Za-z0-9])?$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR311',
            MESSAGE = 'SMTP host must be a host name or IP address';
    END IF;
    IF p_port IS NULL OR p_port NOT BETWEEN 1 AND 65535 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR311',
            MESSAGE = format('SMTP port must be between 1 and 65535, got %s', p_port);
    END IF;
    IF p_security IS NULL OR p_security NOT IN ('none', 'starttls', 'tls') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR312',
            MESSAGE = format(
                'SMTP security must be none, starttls or tls, got %s',
                coalesce(quote_literal(p_security), 'NULL')
            );
    END IF;
    IF p_password IS NOT NULL AND p_key IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR313',
            MESSAGE = 'an SMTP password needs an encryption key (MAILROOM_ENCRYPTION_KEY) to be stored';
    END IF;
    IF p_password IS NOT NULL AND p_username IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR316',
            MESSAGE = 'an SMTP password needs an SMTP username';
    END IF;
    PERFORM mailroom._check_outbound_key(p_key);

    IF p_password IS NOT NULL THEN
        -- The key is 256 random bits, so a salted non-iterated S2K is enough and keeps
        -- decryption cheap at claim time.
        v_encrypted := mailroom._pgp_sym_encrypt(
            p_password, encode(p_key, 'hex'),
            'cipher-algo=aes256, s2k-mode=1, s2k-digest-algo=sha256, compress-algo=0'
        );
    END IF;

    INSERT INTO mailroom.senders AS s (
        name, from_address, smtp_host, smtp_port, smtp_security,
        smtp_username, smtp_password_encrypted, created_at, updated_at
    )
    VALUES (
        p_name, p_from_address, p_host, p_port, p_security,
        p_username, v_encrypted, mailroom.clock(), mailroom.clock()
    )
    ON CONFLICT (name) DO UPDATE SET
        from_address = excluded.from_address,
        smtp_host = excluded.smtp_host,
        smtp_port = excluded.smtp_port,
        smtp_security = excluded.smtp_security,
        smtp_username = excluded.smtp_username,
        smtp_password_encrypted = excluded.smtp_password_encrypted,
        updated_at = excluded.updated_at
    RETURNING s.id INTO v_id;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom.upsert_sender(text, text, text, integer, text, text, text, bytea) IS
'Create or replace a sending identity and its SMTP relay; the password is encrypted with p_key.';

GRANT EXECUTE ON FUNCTION mailroom.upsert_sender(text, text, text, integer, text, text, text, bytea) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom._smtp_password(
    p_encrypted bytea, p_key bytea, p_sender text
)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_encrypted IS NULL OR p_key IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM mailroom._check_outbound_key(p_key);
    BEGIN
        RETURN mailroom._pgp_sym_decrypt(p_encrypted, encode(p_key, 'hex'));
    EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR315',
            MESSAGE = format(
                'cannot decrypt the SMTP password of sender %s: wrong encryption key', p_sender
            );
    END;
END;
$$;

COMMENT ON FUNCTION mailroom._check_outbound_key(bytea) IS
'Internal: raise MR314 unless the encryption key is NULL or 32 bytes.';

COMMENT ON FUNCTION mailroom._smtp_password(bytea, bytea, text) IS
'Internal: decrypt a relay password with the key the caller passes (NULL without one; MR315 wrong key).';

CREATE OR REPLACE FUNCTION mailroom.list_senders()
RETURNS TABLE (
    name text,
    from_address text,
    smtp_host text,
    smtp_port integer,
    smtp_security text,
    smtp_username text,
    password_set boolean,
    bounce_domain text,
    queued bigint,
    created_at timestamptz,
    updated_at timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Every sending identity and its relay, without the password (only whether one is stored),
    -- and how many of its messages wait in the queue (queued or held).
    RETURN QUERY
    SELECT
        s.name,
        s.from_address,
        s.smtp_host,
        s.smtp_port,
        s.smtp_security,
        s.smtp_username,
        s.smtp_password_encrypted IS NOT NULL,
        s.bounce_domain,
        (
            SELECT count(*) FROM mailroom.outbound_messages AS m
            WHERE m.sender_id = s.id AND m.status IN ('queued', 'held')
        ),
        s.created_at,
        s.updated_at
    FROM mailroom.senders AS s
    ORDER BY s.name;
END;
$$;

COMMENT ON FUNCTION mailroom.list_senders() IS
'Every sending identity: from address, relay host, port, security and username, whether a password is stored (never the password), bounce domain, messages waiting.';

GRANT EXECUTE ON FUNCTION mailroom.list_senders() TO mailroom_admin;
