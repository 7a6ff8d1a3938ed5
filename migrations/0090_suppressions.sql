-- The suppression list (issue 15, part 1): addresses mailroom no longer sends to. Filled by
-- suppress() (manual, complaint), by finalize_messages (a synchronous 5xx to the only recipient
-- of a message: hard_bounce, with that message's id) and later by bounce parsing (VERP), which
-- only needs to call the same insert with reason hard_bounce and the message id it decoded.
-- Reached only through the functions of sql/38_outbound_suppressions.sql: no grant.
CREATE TABLE mailroom.suppressions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- the stored form: mailroom._normalize_address (trimmed, no angle brackets, lower case)
    address text NOT NULL,
    reason text NOT NULL,
    -- the outbound message whose bounce put the address here; not a foreign key: purging a
    -- message must not touch the list (the id may then point at nothing)
    source_message bigint,
    created_at timestamptz NOT NULL,
    -- NULL: until removed; else the suppression no longer applies from this instant on
    expires_at timestamptz,
    CONSTRAINT suppressions_address_key UNIQUE (address),
    CONSTRAINT suppressions_address_check CHECK (address <> '' AND address = lower(btrim(btrim(address), '<>'))),
    CONSTRAINT suppressions_reason_check CHECK (reason IN ('hard_bounce', 'complaint', 'manual')),
    CONSTRAINT suppressions_expiry_check CHECK (expires_at IS null OR expires_at > created_at)
);

COMMENT ON TABLE mailroom.suppressions IS
'Addresses mailroom does not send to (hard bounce, complaint, manual), optionally until expires_at. PII: admin API only.';

-- Token emails (activation, recovery) not queued because the account's address is suppressed:
-- one row per skipped token, so the collector's batch goes on and an operator can count them.
-- No address here: the token id leads to the account for whoever may read it.
CREATE TABLE mailroom.suppressed_token_emails (
    token_id bigint PRIMARY KEY,
    suppression_id bigint NOT NULL,
    skipped_at timestamptz NOT NULL
);

COMMENT ON TABLE mailroom.suppressed_token_emails IS
'Token emails enqueue_token_emails skipped because the address was suppressed (token id, suppression id, when).';

-- What enqueue_message does with a suppressed recipient: false (default) refuses the whole
-- message (MR318); true drops that recipient, queues the message for the others (the positions
-- dropped are kept in outbound_messages.suppressed_recipients) and refuses it only when no
-- recipient is left.
INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES (
    'outbound.drop_suppressed_recipients', 'false',
    'enqueue_message with a suppressed recipient: false refuses the message (MR318), true drops that recipient',
    'boolean', null, null
)
ON CONFLICT (name) DO NOTHING;

ALTER TABLE mailroom.outbound_messages
ADD COLUMN suppressed_recipients text[] NOT NULL DEFAULT '{}';

COMMENT ON COLUMN mailroom.outbound_messages.suppressed_recipients IS
'Positions (to[2], bcc[1]) enqueue dropped because the address was suppressed; never the addresses.';
