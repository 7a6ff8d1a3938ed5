-- Issue 44 item 2, SMTP AUTH: the SMTP capture credential (docs/architecture.md, "The SMTP capture
-- credential"). A credential of its own, not an API-key scope: `mailroom smtpcred create --owner …`
-- makes a username and a secret on the client and hands only the secret's sha256 here. A login
-- with it grants one thing: the session's messages are stored in its owner's capture inbox (owner
-- type api), whatever their recipients. Functions: sql/28_smtp_credentials.sql.
CREATE TABLE mailroom.smtp_credentials (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner_id text NOT NULL CHECK (owner_id = btrim(owner_id) AND owner_id <> '' AND length(owner_id) <= 200),
    username text NOT NULL CHECK (username ~ '^[a-z0-9_-]{1,64}$'),
    digest bytea NOT NULL CHECK (octet_length(digest) = 32),
    label text CHECK (length(label) <= 200),
    -- the capture inbox's id: no foreign key (on Citus mailboxes are distributed, this a reference
    -- table); a purged one is simply not found, and the next login makes a new one
    capture_mailbox_id bigint,
    created_at timestamptz NOT NULL,
    last_login_at timestamptz,
    revoked_at timestamptz,
    CONSTRAINT smtp_credentials_username_key UNIQUE (username)
);

COMMENT ON TABLE mailroom.smtp_credentials IS
'SMTP capture credentials (SMTP AUTH): username, sha256 of the secret only, the owner''s capture inbox; revoked_at set = refused.';
COMMENT ON COLUMN mailroom.smtp_credentials.capture_mailbox_id IS
'The inbox every message of a logged-in session is stored in (owner type api, the owner''s); made anew by a login once closed or purged.';

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'smtp.capture_plan', 'pro',
    'The plan of an SMTP credential''s capture inbox; each login extends it to the plan''s max TTL from then',
    'text', '1', '64'
)
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
(
    'MR290', 'inboxes', 'denied', 'unknown, revoked or wrong SMTP credential (the same for each)',
    '535 5.7.8 Authentication credentials invalid', null, null
),
('MR291', 'inboxes', 'usage', 'an SMTP credential digest must be 32 bytes (sha256 of the secret)', null, null, null),
('MR292', 'inboxes', 'not_found', 'no SMTP credential with that id', null, null, null),
(
    'MR293', 'inboxes', 'config', 'the setting smtp.capture_plan names no plan',
    '454 4.3.0 Temporary authentication failure', null, 503
)
ON CONFLICT (code) DO NOTHING;
