-- Issue 45 item 3: the link check asks only the ports of setting checks.link_ports (80 and 443 unless
-- the operator adds one), so one API call cannot fan out to any port of a public host. The setting
-- travels with what the link check reads: http_message_check answers it as a new column, link_ports
-- (unreleased: added in 0.2.0 by migration 0300), so its result changes in place and sql/29_checks.sql
-- re-creates it. A value that is not a list of ports is refused by that call (MR284, 503: the
-- server's configuration).
INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'checks.link_ports', '80,443',
    'The ports the link check asks, comma-separated (1-65535); a URL on another port is that link''s refusal',
    'text', '1', '200'
)
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
(
    'MR284', 'inboxes', 'config',
    'the setting checks.link_ports is not a comma-separated list of ports from 1 to 65535', null, null, 503
)
ON CONFLICT (code) DO NOTHING;

DROP FUNCTION IF EXISTS mailroom.http_message_check(text, text, bytea, bigint, text, boolean);
