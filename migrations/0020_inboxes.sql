-- Expiring inboxes: plans, mailboxes, messages and their settings.
-- Functions live in sql/20_*.sql; this file only holds tables, types, indexes and seed rows.

CREATE TYPE mailroom.mailbox_owner_type AS ENUM ('anonymous', 'api', 'mcp');

COMMENT ON TYPE mailroom.mailbox_owner_type IS
'Who owns a mailbox: an anonymous session (session token), an API client or an MCP client.';

CREATE TABLE mailroom.plans (
    name text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_]*$'),
    default_ttl_minutes integer NOT NULL CHECK (default_ttl_minutes > 0),
    max_ttl_minutes integer NOT NULL,
    max_message_bytes integer NOT NULL CHECK (max_message_bytes > 0),
    max_messages integer NOT NULL CHECK (max_messages > 0),
    CHECK (max_ttl_minutes >= default_ttl_minutes)
);

COMMENT ON TABLE mailroom.plans IS
'Mailbox plans: TTL default and ceiling, largest accepted message, messages kept per mailbox.';

INSERT INTO mailroom.plans (
    name, default_ttl_minutes, max_ttl_minutes, max_message_bytes, max_messages
) VALUES
('free', 10, 60, 2097152, 100),
('pro', 60, 1440, 10485760, 1000),
('enterprise', 1440, 10080, 26214400, 10000)
ON CONFLICT (name) DO NOTHING;

CREATE TABLE mailroom.mailboxes (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    address text NOT NULL,
    plan text NOT NULL REFERENCES mailroom.plans (name),
    owner_type mailroom.mailbox_owner_type NOT NULL DEFAULT 'anonymous',
    owner_id text,
    session_token_digest bytea,
    expires_at timestamptz NOT NULL,
    is_active boolean NOT NULL DEFAULT true,
    message_count integer NOT NULL DEFAULT 0 CHECK (message_count >= 0),
    created_at timestamptz NOT NULL,
    deleted_at timestamptz,
    inactive_since timestamptz,
    CONSTRAINT mailboxes_address_key UNIQUE (address),
    -- Addresses are stored lower-cased, so the unique key is case-insensitive.
    CONSTRAINT mailboxes_address_check CHECK (
        address = lower(address) AND address ~ '^[^@\s]+@[^@\s]+$'
    ),
    -- Anonymous inboxes are authorized by a session token; api/mcp ones by their owner.
    CONSTRAINT mailboxes_owner_check CHECK (
        (
            owner_type = 'anonymous'
            AND owner_id IS null
            AND session_token_digest IS NOT null
        )
        OR (
            owner_type <> 'anonymous'
            AND owner_id IS NOT null
            AND session_token_digest IS null
        )
    ),
    CONSTRAINT mailboxes_inactive_check CHECK (
        is_active = (inactive_since IS null)
    ),
    CONSTRAINT mailboxes_deleted_check CHECK (
        deleted_at IS null OR NOT is_active
    )
);

COMMENT ON TABLE mailroom.mailboxes IS
'Expiring inboxes. is_active flips to false on expiry or soft delete; purge hard-deletes later.';
COMMENT ON COLUMN mailroom.mailboxes.session_token_digest IS
'sha256 of the anonymous session token; the token itself is never stored.';
COMMENT ON COLUMN mailroom.mailboxes.inactive_since IS
'When the mailbox stopped accepting mail (its expires_at, or the delete time); purge retention counts from here.';

-- The expiry sweep's due-query: active mailboxes by expiry time (rows leave it as they expire).
CREATE INDEX mailboxes_expiry_idx ON mailroom.mailboxes (expires_at)
WHERE is_active;

-- The purge due-query: inactive mailboxes by the time they stopped accepting mail.
CREATE INDEX mailboxes_purge_idx ON mailroom.mailboxes (inactive_since)
WHERE NOT is_active;

CREATE INDEX mailboxes_owner_idx ON mailroom.mailboxes (owner_type, owner_id)
WHERE owner_id IS NOT null;

CREATE TABLE mailroom.messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    mailbox_id bigint NOT NULL REFERENCES mailroom.mailboxes (id) ON DELETE CASCADE,
    raw bytea NOT NULL,
    envelope_from text NOT NULL DEFAULT '',
    envelope_to text NOT NULL,
    from_header text,
    subject text,
    text_body text,
    html_body text,
    attachments jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(attachments) = 'array'),
    size_bytes integer NOT NULL CHECK (size_bytes >= 0),
    received_at timestamptz NOT NULL,
    is_read boolean NOT NULL DEFAULT false
);

COMMENT ON TABLE mailroom.messages IS
'Messages delivered to mailboxes: raw RFC 5322 bytes as received plus best-effort parsed fields.';
COMMENT ON COLUMN mailroom.messages.attachments IS
'Attachment metadata only: [{filename, content_type, size, content_id, sha256}].';

CREATE INDEX messages_mailbox_received_idx ON mailroom.messages (mailbox_id, received_at);

INSERT INTO mailroom.settings (name, value, description) VALUES
('inbox.domain', 'mailroom.test', 'Domain of generated inbox addresses.'),
(
    'inbox.expire_batch', '10000',
    'Mailboxes expired per transaction by the expiry worker.'
),
(
    'inbox.purge_batch', '500',
    'Inactive mailboxes hard-deleted (with their messages) per transaction.'
)
ON CONFLICT (name) DO NOTHING;
