-- Issue 35 item 1: a message's tags (set by hand over the API, MCP and the CLI, and by
-- plus-addressing: mail to box+tag@domain is stored in box@domain with the tag; sql/21_delivery.sql),
-- read/unread marks, deleting selected or all messages, extending an inbox over HTTP, and an API key
-- owner's list of all their mail (sql/22_marks.sql, sql/29_http.sql). The tag set is sorted,
-- lower-case, without duplicates, at most 20 tags of at most 64 characters of [a-z0-9._-]
-- (mailroom._message_tags); a filter by tag reads one inbox (messages_mailbox_received_idx), so no
-- index: the accept path maintains none on messages.
ALTER TABLE mailroom.messages ADD COLUMN tags text[] NOT NULL DEFAULT '{}';

COMMENT ON COLUMN mailroom.messages.tags IS
'The message''s tags: sorted, lower-case, distinct, at most 20 of 1-64 characters [a-z0-9._-] (plus-addressing and by hand).';

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR260', 'inboxes', 'usage', 'a tag is 1 to 64 characters of a-z, 0-9, dot, underscore and hyphen', null, null),
('MR261', 'inboxes', 'usage', 'a message has at most 20 tags', null, null),
('MR262', 'inboxes', 'usage', 'a list of message ids must hold 1 to 500 ids', null, null),
('MR263', 'inboxes', 'denied', 'the list of all mail is an API key owner''s: a session token opens one inbox', null, null)
ON CONFLICT (code) DO NOTHING;

-- the message list takes filters (p_tag, p_unread) at the end of its arguments: the old call
-- resolves to the new function, which sql/29_http.sql re-creates (expand/contract, CONTRIBUTING.md)
DROP FUNCTION IF EXISTS mailroom.http_list_messages(text, text, bytea, integer, integer, bigint);
DROP FUNCTION IF EXISTS mailroom._http_message_page(mailroom.mailboxes, integer, integer, bigint);
