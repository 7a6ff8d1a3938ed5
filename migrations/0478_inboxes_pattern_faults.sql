-- A catch-all subdomain pattern (*.example.com, issue 44 item 1) carries no fault: the RCPT and DATA
-- calls find a domain's fault by the recipient's own domain (one probe), so a pattern's would never
-- answer. set_catchall_fault refuses it rather than accept a fault that does nothing.
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
(
    'MR296', 'inboxes', 'usage',
    'a catch-all subdomain pattern carries no fault: set it on a catch-all domain or on an inbox',
    null, null, 400
)
ON CONFLICT (code) DO NOTHING;
