-- Sending identities: upsert_sender stores the relay settings and the password encrypted to the
-- sender key (sql/30: set_sender_public_key), which only `mailroom send` can decrypt: claim_messages
-- returns the ciphertext. _smtp_password decrypts a password of the previous release (symmetric,
-- under a caller-held key) for convert_sender_passwords and the keyed claim (deprecated since 0.2.0, removed in 0.3.0).

CREATE OR REPLACE FUNCTION mailroom_internal._check_outbound_key(p_key bytea)
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

CREATE OR REPLACE FUNCTION mailroom_internal._is_loopback_host(p_host text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT lower(p_host) = 'localhost'
        OR p_host ~ '^127[.][0-9]{1,3}[.][0-9]{1,3}[.][0-9]{1,3}$'
        OR p_host = '::1';
$$;

COMMENT ON FUNCTION mailroom_internal._is_loopback_host(text) IS
'Internal: the relay host is this machine (localhost, 127.0.0.0/8, ::1): a cleartext login never leaves it.';

CREATE OR REPLACE FUNCTION mailroom.set_sender_public_key(p_public_key bytea)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key_id text;
    v_id integer;
BEGIN
    -- pgcrypto must be able to encrypt to it: an RSA (or Elgamal) certificate, binary, with a
    -- single encryption subkey (`mailroom keys sender-init` makes one)
    BEGIN
        v_key_id := mailroom_internal._pgp_key_id(p_public_key);
        PERFORM mailroom_internal._pgp_pub_encrypt('probe', p_public_key, 'cipher-algo=aes256, compress-algo=0');
    EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR324',
            MESSAGE = 'not a public key pgcrypto can encrypt to (a binary OpenPGP RSA key with one encryption subkey)',
            HINT = 'mailroom keys sender-init makes one';
    END;
    IF p_public_key IS NULL OR v_key_id IS NULL OR v_key_id = 'SYMKEY' OR v_key_id = 'ANYKEY' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR324', MESSAGE = 'not a public key pgcrypto can encrypt to';
    END IF;
    LOCK TABLE mailroom.sender_keys IN EXCLUSIVE MODE;
    SELECT k.id INTO v_id FROM mailroom.sender_keys AS k WHERE k.state = 'active' AND k.public_key = p_public_key;
    IF FOUND THEN
        RETURN v_id;
    END IF;
    UPDATE mailroom.sender_keys AS k SET state = 'retired' WHERE k.state = 'active';
    INSERT INTO mailroom.sender_keys AS k (public_key, key_id, state, created_at)
    VALUES (p_public_key, v_key_id, 'active', mailroom.clock())
    RETURNING k.id INTO v_id;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom.set_sender_public_key(bytea) IS
'Make p_public_key (binary OpenPGP, RSA) the sender key that relay passwords are encrypted to; the private half stays '
'where mailroom send runs (MR324 not a key pgcrypto can use). Passwords sealed for an older key need it in the sender''s key file.';

GRANT EXECUTE ON FUNCTION mailroom.set_sender_public_key(bytea) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.sender_public_key()
RETURNS TABLE (id integer, public_key bytea, key_id text, created_at timestamptz)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT k.id, k.public_key, k.key_id, k.created_at FROM mailroom.sender_keys AS k WHERE k.state = 'active';
$$;

COMMENT ON FUNCTION mailroom.sender_public_key() IS
'The active sender public key (binary OpenPGP) and its key id: what a client encrypts a relay password to (no row: none set).';

GRANT EXECUTE ON FUNCTION mailroom.sender_public_key() TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom_internal._seal_for_sender(p_data text)
RETURNS bytea
LANGUAGE plpgsql
VOLATILE
STRICT
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key bytea;
BEGIN
    SELECT k.public_key INTO v_key FROM mailroom.sender_keys AS k WHERE k.state = 'active';
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR313',
            MESSAGE = 'a secret (a relay password, a webhook secret) needs a sender key to be stored',
            HINT = 'mailroom keys sender-init (or SELECT mailroom.set_sender_public_key(...))';
    END IF;
    RETURN mailroom_internal._pgp_pub_encrypt(p_data, v_key, 'cipher-algo=aes256, compress-algo=0');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._seal_for_sender(text) IS
'Internal: p_data encrypted to the active sender public key (MR313 when there is none).';

CREATE OR REPLACE FUNCTION mailroom.upsert_sender(
    p_name text,
    p_from_address text,
    p_host text,
    p_port integer,
    p_security text DEFAULT 'none',
    p_username text DEFAULT null,
    p_password text DEFAULT null,
    p_sealed_password bytea DEFAULT null,
    p_allow_cleartext boolean DEFAULT false
)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_sealed bytea;
    v_key_id text;
    v_foreign boolean;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR310',
            MESSAGE = 'sender name must be 1-64 characters of letters, digits, ".", "_" or "-"';
    END IF;
    IF NOT mailroom_internal._is_valid_address(p_from_address) THEN
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
    IF p_password IS NOT NULL AND p_sealed_password IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR325',
            MESSAGE = 'give the SMTP password or its sealed form, not both';
    END IF;
    IF (p_password IS NOT NULL OR p_sealed_password IS NOT NULL) AND p_username IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR316',
            MESSAGE = 'an SMTP password needs an SMTP username';
    END IF;
    -- credentials over plain TCP only to a relay on this machine, and only when asked for
    IF p_allow_cleartext AND NOT mailroom_internal._is_loopback_host(p_host) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR319',
            MESSAGE = format('sender %s: a cleartext login is allowed only to a relay on this machine', p_name);
    END IF;
    IF p_username IS NOT NULL AND p_security = 'none' AND NOT coalesce(p_allow_cleartext, false) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR319',
            MESSAGE = format('sender %s: an SMTP login needs security starttls or tls', p_name),
            HINT = 'for a relay on this machine (localhost, 127.0.0.0/8, ::1) allow it with p_allow_cleartext => true '
            || '(mailroom outbound sender --allow-cleartext-login)';
    END IF;

    IF p_password IS NOT NULL THEN
        -- encrypted to the sender key as it arrives; only mailroom send can decrypt it
        v_sealed := mailroom_internal._seal_for_sender(p_password);
    ELSIF p_sealed_password IS NOT NULL THEN
        -- encrypted by the client (mailroom outbound sender): it must name the active sender key
        BEGIN
            v_key_id := mailroom_internal._pgp_key_id(p_sealed_password);
        EXCEPTION WHEN OTHERS THEN
            v_key_id := NULL;  -- not an OpenPGP message pgcrypto reads (RFC 9580 packets: v6 PKESK)
        END;
        IF v_key_id IS NULL THEN
            -- it must at least open with a public-key encrypted session key packet (tag 1)
            v_foreign := get_byte(p_sealed_password, 0) NOT IN (132, 133, 134, 193);
        ELSE
            v_foreign := v_key_id IS DISTINCT FROM (
                SELECT k.key_id FROM mailroom.sender_keys AS k WHERE k.state = 'active'
            );
        END IF;
        IF v_foreign THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR325',
                MESSAGE = 'the sealed SMTP password is not encrypted to the active sender key';
        END IF;
        v_sealed := p_sealed_password;
    END IF;

    INSERT INTO mailroom.senders AS s (
        name, from_address, smtp_host, smtp_port, smtp_security,
        smtp_username, smtp_password_encrypted, smtp_password_sealed, smtp_allow_cleartext, created_at, updated_at
    )
    VALUES (
        p_name, p_from_address, p_host, p_port, p_security,
        p_username, NULL, v_sealed, coalesce(p_allow_cleartext, false), mailroom.clock(), mailroom.clock()
    )
    ON CONFLICT (name) DO UPDATE SET
        from_address = excluded.from_address,
        smtp_host = excluded.smtp_host,
        smtp_port = excluded.smtp_port,
        smtp_security = excluded.smtp_security,
        smtp_username = excluded.smtp_username,
        smtp_password_encrypted = excluded.smtp_password_encrypted,
        smtp_password_sealed = excluded.smtp_password_sealed,
        smtp_allow_cleartext = excluded.smtp_allow_cleartext,
        updated_at = excluded.updated_at
    RETURNING s.id INTO v_id;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom.upsert_sender(text, text, text, integer, text, text, text, bytea, boolean) IS
'Create or replace a sending identity and its SMTP relay. The password is stored encrypted to the sender key: pass it '
'(encrypted on arrival) or, better, its sealed form (encrypted by the client; it never reaches the server). A login needs '
'starttls or tls, or p_allow_cleartext for a relay on this machine. Errors: MR303 bad from address, MR310 bad name, '
'MR311 bad host or port, MR312 bad security, MR313 password without a sender key, MR314 bad key, MR316 password without '
'username, MR319 cleartext login refused, MR325 password and sealed form both given or sealed for another key.';

GRANT EXECUTE ON FUNCTION mailroom.upsert_sender(text, text, text, integer, text, text, text, bytea, boolean) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.convert_sender_passwords(p_old_key bytea)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer := 0;
    s record;
BEGIN
    PERFORM mailroom_internal._check_outbound_key(p_old_key);
    IF p_old_key IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR314', MESSAGE = 'the encryption key of the previous release is needed';
    END IF;
    FOR s IN
        SELECT x.id, x.name, x.smtp_password_encrypted
        FROM mailroom.senders AS x
        WHERE x.smtp_password_encrypted IS NOT NULL
        ORDER BY x.id
        FOR UPDATE
    LOOP
        UPDATE mailroom.senders AS x
        SET smtp_password_sealed = mailroom_internal._seal_for_sender(
                mailroom_internal._smtp_password(s.smtp_password_encrypted, p_old_key, s.name)
            ),
            smtp_password_encrypted = NULL,
            updated_at = mailroom.clock()
        WHERE x.id = s.id;
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom.convert_sender_passwords(bytea) IS
'One-time upgrade step: re-encrypt every relay password stored with the previous release''s MAILROOM_ENCRYPTION_KEY '
'(pgp_sym_encrypt) to the sender key, and drop the old ciphertext; returns how many (MR314 key missing or not 32 bytes, MR315 wrong key, MR313 no sender key). '
'The one call that carries that key.';

GRANT EXECUTE ON FUNCTION mailroom.convert_sender_passwords(bytea) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom_internal._smtp_password(
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
    PERFORM mailroom_internal._check_outbound_key(p_key);
    BEGIN
        RETURN mailroom_internal._pgp_sym_decrypt(p_encrypted, encode(p_key, 'hex'));
    EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR315',
            MESSAGE = format(
                'cannot decrypt the SMTP password of sender %s: wrong encryption key', p_sender
            );
    END;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._check_outbound_key(bytea) IS
'Internal: raise MR314 unless the encryption key is NULL or 32 bytes.';

COMMENT ON FUNCTION mailroom_internal._smtp_password(bytea, bytea, text) IS
'Internal, deprecated since 0.2.0, removed in 0.3.0 (the previous release''s relay passwords, until convert_sender_passwords): decrypt a relay password with the key the caller passes (NULL without one; MR315 wrong key).';

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
        s.smtp_password_sealed IS NOT NULL OR s.smtp_password_encrypted IS NOT NULL,
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
