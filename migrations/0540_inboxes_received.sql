-- The Received: trace header (RFC 5321 section 4.4) of mail stored over SMTP (issue 44):
-- deliver_message gains p_trace (the header lines prepended to what it stores), a defaulted last
-- argument, so the previous release's calls resolve to the new form (expand). CREATE OR REPLACE
-- cannot add an argument: the old form is dropped here and sql/21_delivery.sql makes the new one
-- in the same transaction, so no caller finds it missing.
DROP FUNCTION IF EXISTS mailroom.deliver_message(text, bytea, text, jsonb);

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
(
    'MR285', 'inboxes', 'usage',
    'a trace header must be header fields, each line ending in CRLF, continuation lines starting with white space',
    null, null, null
)
ON CONFLICT (code) DO NOTHING;
