-- Issue 36, item 6: the parsed message travels as ONE jsonb document per message (p_parsed, read
-- by name in SQL: subject, from_header, text_body, html_body, attachments, ...), so a new parsed
-- field adds a column and a line where it is stored, not three signatures.
-- deliver_message(p_address, p_raw, p_envelope_from, p_parsed), deliver_messages(..., p_parsed
-- jsonb[]) and deliver_ses_message(..., p_parsed) are new overloads (sql/21_delivery.sql,
-- sql/29_ses.sql); the old signatures stay as dated wrappers for the previous release's servers
-- (CONTRIBUTING, expand/contract), so nothing is dropped for them here.
-- The HTTP shapes' builder reads the message row (sql/29_http.sql): its field-by-field form goes.
DROP FUNCTION IF EXISTS mailroom_internal._http_message_json(
    bigint, timestamptz, text, text, text, text, integer, boolean, jsonb
);

-- MR211 now also refuses a parsed document that is not a JSON object
UPDATE mailroom.error_codes
SET meaning = 'empty message, a parsed document that is not a JSON object, or attachments that are not a JSON array'
WHERE code = 'MR211';
