-- Issue 20, item 3: the keyring. Token signing keys live in mailroom's own table, like
-- mailroom.verp_key: made here, read only inside mailroom's functions, readable by no runtime
-- role. dequeue_tokens and claim_messages sign with the active key; consume_token and
-- verify_token try the active key, then the verify-only ones. Key management
-- (sql/15_keyring.sql): rotate_signing_key, retire_signing_key, export_signing_key,
-- import_signing_key, list_signing_keys, for mailroom_admin (`mailroom keys …`).

CREATE TYPE mailroom.signing_key_state AS ENUM ('active', 'verify_only', 'retired');

COMMENT ON TYPE mailroom.signing_key_state IS
'State of a signing key: active (signs and verifies; exactly one), verify_only (verifies links it signed '
'until retired), retired (verifies nothing; its key bytes are wiped).';

CREATE TABLE mailroom.signing_keys (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- NULL once retired: a retired key verifies nothing and cannot be exported
    key bytea,
    state mailroom.signing_key_state NOT NULL,
    -- generated (by the migration or a rotation) or imported (mailroom keys import)
    origin text NOT NULL CHECK (origin IN ('generated', 'imported')),
    created_at timestamptz NOT NULL,
    state_changed_at timestamptz NOT NULL,
    last_exported_at timestamptz,
    CONSTRAINT signing_keys_key_length CHECK (key IS null OR octet_length(key) >= 32),
    CONSTRAINT signing_keys_retired_wiped CHECK ((state = 'retired') = (key IS null))
);

COMMENT ON TABLE mailroom.signing_keys IS
'The token signing keyring: one active key (signs), verify-only keys (still verify), retired keys (wiped). '
'Owner only: runtime roles reach it through functions; only export_signing_key (admin) returns a key.';

-- exactly one active key at a time (rotate_signing_key swaps it under a table lock)
CREATE UNIQUE INDEX signing_keys_one_active ON mailroom.signing_keys ((true)) WHERE state = 'active';

-- the first active key: 32 bytes of pgcrypto's CSPRNG
INSERT INTO mailroom.signing_keys (key, state, origin, created_at, state_changed_at)
SELECT
    gen_random_bytes(32) AS key,
    'active' AS state,
    'generated' AS origin,
    now() AS created_at,
    now() AS state_changed_at
WHERE NOT EXISTS (SELECT 1 FROM mailroom.signing_keys);

REVOKE ALL ON mailroom.signing_keys FROM public;
