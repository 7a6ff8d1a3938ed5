-- Issue 20, item 3: a token's secret and code are made where they are first needed, at the
-- dispatch that signs them (dequeue_tokens for `collect` to stdout; claim_messages for a token
-- email, so every delivery attempt carries a fresh secret), and only their digests are kept.
-- A token waiting for dispatch therefore has no secret and no digests yet; no row ever holds a
-- plaintext secret or code again (the columns stay, always NULL, for one release).

ALTER TABLE mailroom.tokens
ALTER COLUMN secret_digest DROP NOT NULL,
ALTER COLUMN code_digest DROP NOT NULL;

-- Tokens issued by the previous release and not yet dispatched: their plaintext goes; the
-- dispatch mints a fresh secret and code (nobody has seen these ones).
UPDATE mailroom.tokens
SET secret = null, code = null, secret_digest = null, code_digest = null
WHERE secret IS NOT null OR code IS NOT null;

ALTER TABLE mailroom.tokens
ADD CONSTRAINT tokens_no_plaintext CHECK (secret IS null AND code IS null);

COMMENT ON COLUMN mailroom.tokens.secret IS
'Always NULL since migration 0126 (the secret is minted at dispatch and only its digest kept); dropped in a later release.';

COMMENT ON COLUMN mailroom.tokens.code IS
'Always NULL since migration 0126 (the code is minted at dispatch and only its digest kept); dropped in a later release.';

-- sign_token took the key as an argument; it now signs with the keyring (sql/11_tokens.sql)
DROP FUNCTION IF EXISTS mailroom.sign_token(mailroom.token_action, bytea, text, bytea);
DROP FUNCTION IF EXISTS mailroom._dequeue_tokens_sql();
