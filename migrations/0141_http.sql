-- Issue 24, the inboxes' HTTP face: API keys, creation rate limits, catch-all domains, SES
-- receipts (replay protection) and the search vector of messages. Functions: sql/24_catchall.sql,
-- sql/27_search.sql, sql/28_api_keys.sql, sql/29_http.sql, sql/29_ses.sql.

-- API keys: owner type 'api' of mailboxes. The key is made by the client (`mailroom apikey
-- create`) and only its sha256 comes here: the key itself is never stored or sent to the database.
CREATE TABLE mailroom.api_keys (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner_id text NOT NULL CHECK (owner_id = btrim(owner_id) AND owner_id <> '' AND length(owner_id) <= 200),
    digest bytea NOT NULL CHECK (octet_length(digest) = 32),
    label text CHECK (length(label) <= 200),
    hint text CHECK (length(hint) <= 8),
    created_at timestamptz NOT NULL,
    revoked_at timestamptz,
    CONSTRAINT api_keys_digest_key UNIQUE (digest)
);

COMMENT ON TABLE mailroom.api_keys IS
'API keys of owner type api: sha256 of the key only (the key never reaches the database); revoked_at set = refused.';
COMMENT ON COLUMN mailroom.api_keys.hint IS
'The last 4 characters of the key, so an operator can tell keys apart; not enough to use it.';

-- Creation rate limits of the HTTP API: one row per subject (an API key, or a client address
-- keyed with the redaction pepper), a fixed window each.
CREATE TABLE mailroom.http_rate_limits (
    subject bytea PRIMARY KEY,
    window_start timestamptz NOT NULL,
    used integer NOT NULL CHECK (used >= 0)
);

COMMENT ON TABLE mailroom.http_rate_limits IS
'Mailboxes created over HTTP per subject (API key digest or keyed client address) in the current window.';

CREATE INDEX http_rate_limits_window_idx ON mailroom.http_rate_limits (window_start);

-- Catch-all domains: the first RCPT to an unknown address on such a domain creates its inbox.
CREATE TABLE mailroom.catchall_domains (
    domain text PRIMARY KEY,
    owner_id text NOT NULL CHECK (owner_id = btrim(owner_id) AND owner_id <> ''),
    plan text NOT NULL REFERENCES mailroom.plans (name),
    ttl_minutes integer CHECK (ttl_minutes > 0),
    max_open integer NOT NULL CHECK (max_open > 0),
    created_at timestamptz NOT NULL
);

COMMENT ON TABLE mailroom.catchall_domains IS
'Catch-all inbox domains: unknown addresses on them get an inbox at RCPT, owned by (api, owner_id), at most max_open open at once.';

ALTER TABLE mailroom.mailboxes ADD COLUMN catchall_domain text;

COMMENT ON COLUMN mailroom.mailboxes.catchall_domain IS
'The catch-all domain whose first RCPT created this inbox (its quota counts it while it is active), else NULL.';

-- the quota's count: the active catch-all inboxes of a domain
CREATE INDEX mailboxes_catchall_idx ON mailroom.mailboxes (catchall_domain)
WHERE catchall_domain IS NOT null AND is_active;

-- SES receipts seen by the SNS hook: a replayed notification of the same mail stores nothing.
CREATE TABLE mailroom.ses_receipts (
    ses_message_id text PRIMARY KEY CHECK (length(ses_message_id) BETWEEN 1 AND 200),
    received_at timestamptz NOT NULL,
    stored integer NOT NULL
);

COMMENT ON TABLE mailroom.ses_receipts IS
'SES messageIds already handled by POST /hooks/ses (replays are idempotent), kept for setting ses.replay_window.';

CREATE INDEX ses_receipts_received_idx ON mailroom.ses_receipts (received_at);

-- Full-text search: filled after delivery (index_messages), never in deliver_message's statement,
-- so the accept path does not compute it; no index on it, so filling it is a HOT update.
-- search_messages matches a message not filled yet by computing its vector on the fly.
ALTER TABLE mailroom.messages ADD COLUMN search_vector tsvector;

COMMENT ON COLUMN mailroom.messages.search_vector IS
'Search vector (subject, from, text), filled after delivery by index_messages; NULL until then (searched on the fly).';

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'http.anonymous_plan', 'free',
    'Plan of mailboxes created over HTTP without an API key (other plans need a key).',
    'name', '1', '63'
),
(
    'http.create_limit', '30',
    'Mailboxes one API key or one client address may create over HTTP per http.create_window.',
    'integer', '1', '1000000'
),
(
    'http.create_window', '1 minute',
    'Window of http.create_limit.',
    'interval', '1 second', '1 day'
),
(
    'ses.replay_window', '7 days',
    'How long a handled SES messageId is remembered, so a replayed notification stores nothing.',
    'interval', '1 hour', '90 days'
)
ON CONFLICT (name) DO NOTHING;
