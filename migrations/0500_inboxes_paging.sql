-- Paging everywhere, and a full free inbox that lets the oldest go (issue 44 item 4; docs/http.md,
-- docs/inboxes.md "A full inbox").
--
-- Keyset paging (before_id) on an inbox's list, its page and its search, and a search of an API key
-- owner's mail: each function gets a DEFAULTed argument at the end, so the previous release's calls
-- resolve to the new forms (expand); CREATE OR REPLACE cannot add an argument, so the old forms are
-- dropped here and sql/27_search.sql and sql/29_http.sql re-create them in this same transaction.
DROP FUNCTION IF EXISTS mailroom.http_list_messages(text, text, bytea, integer, integer, bigint, text, boolean);
DROP FUNCTION IF EXISTS mailroom.http_mailbox_view(text, text, bytea, integer, integer, bigint);
DROP FUNCTION IF EXISTS mailroom.http_search_messages(text, text, bytea, text, integer);
DROP FUNCTION IF EXISTS mailroom.http_list_all_messages(text, bytea, integer, bigint, text, boolean);
DROP FUNCTION IF EXISTS mailroom_internal._http_message_page(mailroom.mailboxes, integer, integer, bigint, text, boolean);
-- one inbox's search becomes the search of a set of inboxes (sql/27_search.sql, _search_mailboxes)
DROP FUNCTION IF EXISTS mailroom_internal._search_mailbox(mailroom.mailboxes, text, integer);

-- list_plans answers each plan's when_full too (a column added to its result: sql/20_mailboxes.sql)
DROP FUNCTION IF EXISTS mailroom.list_plans();

-- A search page's cursor is its last message: the next page is what ranks after it. Gone (deleted or
-- let go), it ranks nowhere: the caller starts again from the first page.
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
(
    'MR218', 'inboxes', 'conflict',
    'a search page''s before_id names no message of the inbox any more (deleted or let go): search again from the first page',
    null, null, 409
)
ON CONFLICT (code) DO NOTHING;

-- The free plan lets its oldest message go when full, as Mailpit does and as the sink's plan does: a
-- test inbox that took 100 messages keeps taking the newest. Paid plans keep refusing (552 5.2.2): a
-- plan sold for what it keeps does not drop mail silently. Only a free plan still at the old default.
UPDATE mailroom.plans SET when_full = 'drop_oldest'
WHERE name = 'free' AND when_full = 'refuse';
