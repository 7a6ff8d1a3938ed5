-- Outbound queue: sending identities (SMTP relays), the message queue, policy settings,
-- the redaction pepper and the fencing counters. Functions live in sql/3x_*.sql.

CREATE TYPE mailroom.outbound_status AS ENUM ('queued', 'processing', 'sent', 'failed');

CREATE TABLE mailroom.senders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    from_address text NOT NULL,
    smtp_host text NOT NULL,
    smtp_port integer NOT NULL CHECK (smtp_port BETWEEN 1 AND 65535),
    smtp_security text NOT NULL DEFAULT 'none'
    CHECK (smtp_security IN ('none', 'starttls', 'tls')),
    smtp_username text,
    -- pgp_sym_encrypt(password, hex(key)); the key is passed by the caller, never stored.
    smtp_password_encrypted bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE mailroom.senders IS
'Sending identities and their SMTP relay; the password is encrypted with a caller-held key.';

CREATE TABLE mailroom.outbound_messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sender_id bigint NOT NULL REFERENCES mailroom.senders (id),
    to_addrs text[] NOT NULL DEFAULT '{}',
    cc_addrs text[] NOT NULL DEFAULT '{}',
    bcc_addrs text[] NOT NULL DEFAULT '{}',
    subject text NOT NULL,
    text_body text,
    html_body text,
    headers jsonb NOT NULL DEFAULT '{}',
    -- generated once at enqueue, stable across retries (receivers de-duplicate on it)
    message_id text NOT NULL,
    status mailroom.outbound_status NOT NULL DEFAULT 'queued',
    attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_retry_at timestamptz,
    send_after timestamptz,
    idempotency_key text,
    claimed_by text,
    claim_token bigint,
    claimed_at timestamptz,
    lease_expires_at timestamptz,
    last_outcome text,
    last_smtp_code integer,
    last_enhanced_code text,
    -- sensitive: always written through mailroom.redact_pii (trigger enforced)
    error_log text,
    possibly_sent boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE mailroom.outbound_messages IS
'Outbound mail queue (queued -> processing -> sent | failed). error_log is sensitive.';

-- The due-query index: claim_messages scans it in order and stops after LIMIT rows.
CREATE INDEX outbound_messages_due_idx
ON mailroom.outbound_messages (
    (coalesce(next_retry_at, '-infinity'::timestamptz)), id
)
WHERE status = 'queued';

-- The reaper's index: only in-flight rows.
CREATE INDEX outbound_messages_processing_idx
ON mailroom.outbound_messages (lease_expires_at, claimed_at)
WHERE status = 'processing';

-- Operators list and retry failed rows.
CREATE INDEX outbound_messages_failed_idx
ON mailroom.outbound_messages (id)
WHERE status = 'failed';

CREATE UNIQUE INDEX outbound_messages_idempotency_key_idx
ON mailroom.outbound_messages (idempotency_key)
WHERE idempotency_key IS NOT null;

CREATE SEQUENCE mailroom.outbound_claim_token_seq CACHE 64;

-- Counters that survive restarts (outcomes ignored by fencing, rows reaped).
CREATE TABLE mailroom.outbound_counters (
    name text PRIMARY KEY,
    value bigint NOT NULL DEFAULT 0
);

INSERT INTO mailroom.outbound_counters (name, value)
VALUES ('stale_outcomes', 0), ('reaped', 0)
ON CONFLICT (name) DO NOTHING;

-- The redaction pepper: a random value generated here, readable by no API function
-- (only mailroom.redact_pii uses it). It is NOT an encryption or signing key: it only
-- keys the correlation hash so <redacted:HASH> tags cannot be reversed by hashing guesses.
CREATE TABLE mailroom.redaction_pepper (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pepper bytea NOT NULL
);

INSERT INTO mailroom.redaction_pepper (singleton, pepper)
VALUES (true, gen_random_bytes(32))
ON CONFLICT (singleton) DO NOTHING;

REVOKE ALL ON mailroom.redaction_pepper FROM public;

INSERT INTO mailroom.settings (name, value, description) VALUES
(
    'outbound.max_attempts', '10',
    'delivery attempts before a transiently failing message is failed'
),
(
    'outbound.backoff_base', '1 minute',
    'retry delay unit: next_retry_at = clock + backoff_base * attempts ^ backoff_exponent'
),
(
    'outbound.backoff_exponent', '2',
    'exponent of the retry delay (2: 1m, 4m, 9m, ...)'
),
(
    'outbound.backoff_max', '1 day',
    'upper bound of one retry delay'
),
(
    'outbound.lease', '5 minutes',
    'how long a claim is held before the reaper may take the row back'
),
(
    'outbound.max_recipients', '100',
    'maximum recipients (to + cc + bcc) per message'
),
(
    'outbound.max_message_bytes', '10485760',
    'maximum size of subject + bodies + extra headers, in bytes'
),
(
    'outbound.error_log_max_chars', '8192',
    'error_log keeps at most this many trailing characters'
)
ON CONFLICT (name) DO NOTHING;
