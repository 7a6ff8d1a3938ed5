-- Issue 35 item 3: checks of the mail itself (docs/checks.md). The HTTP face reads what a check
-- needs in one call (sql/29_checks.sql, http_message_check) and runs the check at its edge; a check
-- this server does not run (the link check without --link-check, the spam check without --spamd)
-- is refused by that call with its code, answered 503, and the HTML check of a message without an
-- HTML part is MR282 (404).
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
('MR280', 'inboxes', 'config', 'the link check is off on this server (mailroom http serve --link-check)', null, null, 503),
('MR281', 'inboxes', 'config', 'the spam check is off on this server (mailroom http serve --spamd host:port)', null, null, 503),
('MR282', 'inboxes', 'not_found', 'the message has no HTML part to check', null, null, null),
('MR283', 'inboxes', 'usage', 'unknown check: html, links or spam', null, null, null)
ON CONFLICT (code) DO NOTHING;
