-- Issue 37: mailroom_internal._http_message_document (unreleased, added by the same issue) finds a
-- message's link and code itself, from the row it is given, where http_read_message and
-- mcp_read_message each passed them in: it takes the row alone. The form with the two arguments goes.
DROP FUNCTION IF EXISTS mailroom_internal._http_message_document(mailroom.messages, text, text);
