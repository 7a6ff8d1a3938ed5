-- Issue 20, item 4 and issue 21, item 8: relay passwords the server cannot read, and no
-- password over cleartext.
--
-- A sender keypair (OpenPGP, RSA: what pgcrypto's pgp_pub_encrypt takes): its public half is
-- here, so an admin can still set a relay password from psql (upsert_sender encrypts it with
-- pgp_pub_encrypt) or from the CLI (which encrypts it before sending: it never reaches the
-- server); its private half exists only where `mailroom send` runs (MAILROOM_SENDER_KEY_FILE).
-- claim_messages returns the ciphertext; the sender decrypts it. The symmetric ciphertexts of the
-- previous release (pgp_sym_encrypt under MAILROOM_ENCRYPTION_KEY) stay until
-- convert_sender_passwords re-encrypts them, the one call that takes that key (docs/outbound.md).

CREATE TABLE mailroom.sender_keys (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- binary OpenPGP certificate: a primary key and one RSA encryption subkey
    public_key bytea NOT NULL,
    -- pgp_key_id() of the key pgp_pub_encrypt encrypts to (the encryption subkey)
    key_id text NOT NULL,
    state text NOT NULL CHECK (state IN ('active', 'retired')),
    created_at timestamptz NOT NULL
);

COMMENT ON TABLE mailroom.sender_keys IS
'Public halves of the sender keypairs (set_sender_public_key); the active one encrypts relay passwords. '
'The private halves never reach the database.';

CREATE UNIQUE INDEX sender_keys_one_active ON mailroom.sender_keys ((true)) WHERE state = 'active';

REVOKE ALL ON mailroom.sender_keys FROM public;

ALTER TABLE mailroom.senders
ADD COLUMN smtp_password_sealed bytea,
ADD COLUMN smtp_allow_cleartext boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN mailroom.senders.smtp_password_encrypted IS
'Previous release: pgp_sym_encrypt(password, hex(MAILROOM_ENCRYPTION_KEY)); emptied by convert_sender_passwords.';

COMMENT ON COLUMN mailroom.senders.smtp_password_sealed IS
'The relay password encrypted for the sender keypair (pgp_pub_encrypt); only mailroom send can decrypt it.';

COMMENT ON COLUMN mailroom.senders.smtp_allow_cleartext IS
'The operator''s opt-in to log in without TLS (security none), accepted only for a loopback relay.';

-- Relays that already log in over cleartext keep working when they are on this machine (the
-- opt-in is what upsert_sender now asks for); any other such relay is refused by the sender
-- until it gets TLS (issue 21, item 8).
UPDATE mailroom.senders AS s
SET smtp_allow_cleartext = true
WHERE
    s.smtp_security = 'none'
    AND s.smtp_username IS NOT null
    AND (
        s.smtp_host = 'localhost'
        OR s.smtp_host ~ '^127[.][0-9]{1,3}[.][0-9]{1,3}[.][0-9]{1,3}$'
        OR s.smtp_host = '::1'
    );

-- Signatures that change (sql/30_outbound_senders.sql, sql/33_outbound_claim.sql):
-- upsert_sender loses its key (an old admin call cannot be kept: it would be ambiguous with the
-- new one); claim_messages' keyed form stays one release, without defaults, so a call without
-- a key resolves to the new form.
DROP FUNCTION IF EXISTS mailroom.upsert_sender(text, text, text, integer, text, text, text, bytea);
DROP FUNCTION IF EXISTS mailroom.claim_messages(integer, text, bytea, interval);
DROP FUNCTION IF EXISTS mailroom._claim_cached(timestamptz, integer, text, interval, bytea);
