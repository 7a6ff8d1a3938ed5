-- Issue 44, item 8: webhooks out (docs/webhooks.md; docs/architecture.md, "Agreed for issues 43-47").
-- A webhook delivery is a row of outbound_messages of kind 'webhook': the one claim, finalize,
-- backoff, reaper, retention and queue verbs serve it. Its endpoint (a URL, the events it wants
-- and its whsec_ secret sealed for the sender keypair, like relay passwords) is a row of
-- webhook_endpoints, registered by an API key (the events of its owner's inboxes) or by an
-- operator for a sender (the outcomes of its mail).

CREATE TABLE mailroom.webhook_endpoints (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- an API key's endpoint: the key, and its owner (copied: the delivery path looks endpoints up by owner)
    key_id bigint REFERENCES mailroom.api_keys (id) ON DELETE CASCADE,
    owner_id text,
    -- an operator's endpoint for a sender's outcomes
    sender_id bigint REFERENCES mailroom.senders (id) ON DELETE CASCADE,
    url text NOT NULL CHECK (length(url) BETWEEN 8 AND 2000),
    events text[] NOT NULL CHECK (cardinality(events) BETWEEN 1 AND 8),
    -- 'whsec_' + base64 of 24 random bytes, encrypted to the active sender key (pgp_pub_encrypt)
    secret_sealed bytea NOT NULL,
    created_at timestamptz NOT NULL,
    CONSTRAINT webhook_endpoints_one_owner CHECK ((key_id IS null) <> (sender_id IS null)),
    CONSTRAINT webhook_endpoints_key_owner CHECK ((key_id IS null) = (owner_id IS null))
);

COMMENT ON TABLE mailroom.webhook_endpoints IS
'Webhook endpoints (docs/webhooks.md): an API key''s (events of its owner''s inboxes) or a sender''s (outcomes of its '
'mail); the whsec_ secret sealed for the sender keypair, opened only by mailroom send.';
COMMENT ON COLUMN mailroom.webhook_endpoints.secret_sealed IS
'The whsec_ signing secret encrypted for the active sender key (pgp_pub_encrypt); only mailroom send can decrypt it.';

CREATE INDEX webhook_endpoints_owner_idx ON mailroom.webhook_endpoints (owner_id) WHERE owner_id IS NOT null;
CREATE INDEX webhook_endpoints_sender_idx ON mailroom.webhook_endpoints (sender_id) WHERE sender_id IS NOT null;
CREATE INDEX webhook_endpoints_key_idx ON mailroom.webhook_endpoints (key_id) WHERE key_id IS NOT null;

REVOKE ALL ON mailroom.webhook_endpoints FROM public;

-- The kind of an outbound row: mail (every row so far) or webhook. Adding a column with a constant
-- default and dropping NOT NULL change no row (no rewrite, no scan).
ALTER TABLE mailroom.outbound_messages
ADD COLUMN kind text NOT NULL DEFAULT 'mail',
ADD COLUMN webhook_endpoint_id bigint,
ALTER COLUMN sender_id DROP NOT NULL;

COMMENT ON COLUMN mailroom.outbound_messages.kind IS
'mail, or webhook: a webhook delivery (its endpoint webhook_endpoint_id, its event type in subject, its JSON payload '
'in text_body, its webhook-id in message_id; no sender).';
COMMENT ON COLUMN mailroom.outbound_messages.webhook_endpoint_id IS
'A webhook delivery''s endpoint (webhook_endpoints.id); NULL for mail. No foreign key: a delivery outlives a removed '
'endpoint (it then fails at its next claim).';

-- An endpoint's deliveries, newest first (webhook_deliveries, the count of list_webhooks), without
-- reading the queue: the build reads each partition once and finds no webhook row in one upgraded.
CREATE INDEX outbound_messages_webhook_idx ON mailroom.outbound_messages (webhook_endpoint_id, id)
WHERE kind = 'webhook';
-- (the partitions' copies are named by PostgreSQL here, on a fresh install and an upgrade alike;
-- maintain_partitions gives them the house's names, <partition>_webhook_idx, as it does every index)

-- The claim's row: a webhook row's URL and sealed secret (columns added, never removed).
ALTER TYPE mailroom.claimed_message
ADD ATTRIBUTE kind text,
ADD ATTRIBUTE webhook_url text,
ADD ATTRIBUTE webhook_secret_sealed bytea;

INSERT INTO mailroom.outbound_counters (name, value)
VALUES ('webhook_possible_duplicates', 0)
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES
(
    'webhooks.max_endpoints_per_key', '10',
    'webhook endpoints an API key (or a sender) may register; over it MR347',
    'integer', '1', '100'
),
(
    'webhooks.max_payload_bytes', '65536',
    'largest webhook payload (JSON, bytes): longer text fields of an event are cut to fit',
    'integer', '1024', '1048576'
)
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
('MR345', 'outbound', 'usage', 'a webhook URL must be an http or https URL of at most 2000 characters', null, null, 422),
(
    'MR346', 'outbound', 'usage',
    'unknown webhook event (message.received, inbox.expired; for a sender message.sent, message.failed, message.bounced)',
    null, null, 422
),
('MR347', 'outbound', 'limit', 'too many webhook endpoints (setting webhooks.max_endpoints_per_key)', null, null, 409),
('MR348', 'outbound', 'not_found', 'unknown webhook endpoint', null, null, 404),
('MR349', 'outbound', 'not_found', 'unknown webhook delivery', null, null, 404),
('MR354', 'outbound', 'conflict', 'the webhook delivery is queued or being delivered: nothing to replay', null, null, 409),
('MR355', 'outbound', 'not_found', 'unknown sender', null, null, 404),
('MR356', 'outbound', 'not_found', 'unknown or revoked API key id', null, null, 404)
ON CONFLICT (code) DO NOTHING;
