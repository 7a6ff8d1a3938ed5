-- Issue 45, item 1: release is forwarding, not relaying (sql/32_outbound_release.sql; docs/outbound.md,
-- "Releasing a captured message"). A release takes one from the API key's and one from the inbox's
-- rate (sql/09_rates.sql), goes only to an address of release.allowed_recipients (empty: none), and
-- writes one line of mailroom.audit_log.
INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES
(
    'release.rate_per_key', '30/h',
    'releases an API key (or an application owner) may make: "N/min" or "N/h"; over it MR020 (HTTP 429)',
    'rate', null, '1000000'
),
(
    'release.rate_per_inbox', '10/h',
    'releases of the messages of one inbox: "N/min" or "N/h"; over it MR020 (HTTP 429)',
    'rate', null, '1000000'
),
(
    'release.allowed_recipients', '',
    'comma-separated address globs a message may be released to ("*@example.com, qa-*@corp.example"; * is any run of characters); empty: none (MR021)',
    'globs', null, '2000'
)
ON CONFLICT (name) DO NOTHING;

UPDATE mailroom.settings
SET description = 'comma-separated owner types of the inboxes whose messages may be released (api, mcp, anonymous, app, …); catch-all inboxes only when it lists catchall'
WHERE name = 'release.owner_types';

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
('MR390', 'outbound', 'usage', 'the message''s header cannot be forwarded (it holds a NUL byte)', null, null, 422)
ON CONFLICT (code) DO NOTHING;
