-- Issue 45: one rate and allow-list mechanism (sql/09_rates.sql; docs/architecture.md, "One rate and
-- allow-list mechanism"), shared by release, the checks and, later, send over HTTP and SMTP logins.
--
-- Two setting kinds (checked by set_setting, sql/01_settings.sql):
--   rate   "N/min" or "N/h": at most N in any minute, or in any 60 minutes; N from 0 to max_value
--   globs  a comma-separated list of address globs ("*@example.com, qa-*@corp.example"): "*" is any
--          run of characters, nothing else is special; empty allows none; max_value: length
ALTER TABLE mailroom.settings DROP CONSTRAINT settings_kind_check;
ALTER TABLE mailroom.settings ADD CONSTRAINT settings_kind_check CHECK (
    kind IN ('interval', 'integer', 'number', 'boolean', 'text', 'name', 'domain', 'url', 'rate', 'globs')
);

COMMENT ON COLUMN mailroom.settings.kind IS
'What the value must be: interval, integer, number, boolean, text, name, domain, url, rate ("N/min", "N/h") or globs (comma-separated address globs), checked by set_setting.';

-- One row per scope, subject and one-minute window: how many were taken in it. The subject is an
-- id (an API key's, a mailbox's) or a digest, never an address. maintain_partitions deletes the
-- windows older than the longest limit (one hour).
CREATE TABLE mailroom.rate_windows (
    scope text NOT NULL CHECK (scope ~ '^[a-z][a-z0-9_.]{0,62}$'),
    subject text NOT NULL CHECK (length(subject) BETWEEN 1 AND 100),
    window_start timestamptz NOT NULL,
    hits integer NOT NULL CHECK (hits > 0),
    PRIMARY KEY (scope, subject, window_start)
);

CREATE INDEX rate_windows_window_start_idx ON mailroom.rate_windows (window_start);

COMMENT ON TABLE mailroom.rate_windows IS
'Rate limits (sql/09_rates.sql _take_rate): hits per scope, subject (an id or a digest, never an address) and one-minute window.';

REVOKE ALL ON mailroom.rate_windows FROM public;

-- One line per release (and, later, per send over HTTP): who by key id or owner id, what, to how
-- many recipients. No address, no subject line: what went where is the outbound row's business.
CREATE TABLE mailroom.audit_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL,
    action text NOT NULL CHECK (action ~ '^[a-z][a-z0-9_.]{0,62}$'),
    key_id bigint,
    owner_type text CHECK (length(owner_type) <= 40),
    owner_id text CHECK (length(owner_id) <= 200),
    mailbox_id bigint,
    message_id bigint,
    outbound_id bigint,
    recipients integer NOT NULL CHECK (recipients >= 0)
);

CREATE INDEX audit_log_at_idx ON mailroom.audit_log (at);

COMMENT ON TABLE mailroom.audit_log IS
'One line per release (release_message) and send: when, what, the API key id or owner, the ids involved and how many recipients; never an address. Kept audit.retention.';

REVOKE ALL ON mailroom.audit_log FROM public;

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES (
    'audit.retention', '90 days',
    'how long a line of mailroom.audit_log is kept (maintain_partitions deletes older ones)',
    'interval', '1 day', '3650 days'
)
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
('MR020', 'foundation', 'limit', 'over a rate limit (the setting is named in the message); DETAIL: the seconds to wait', null, null, 429),
('MR021', 'foundation', 'denied', 'the recipient matches no glob of the allow-list setting named in the message (empty allows none)', null, null, 403)
ON CONFLICT (code) DO NOTHING;
