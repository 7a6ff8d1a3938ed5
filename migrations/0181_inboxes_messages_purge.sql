-- Purging mailboxes deleted their messages through ON DELETE CASCADE: one cascade query per
-- mailbox, each probing every partition of messages (issue 25: 10^6 inboxes took 192 s, 5-10x
-- the time before partitioning). The link is kept by triggers instead (sql/23_expiry.sql): a
-- message insert checks its mailbox under FOR KEY SHARE, as the foreign key did, and a
-- statement trigger deletes the messages of every mailbox a DELETE removed, in one statement.
ALTER TABLE mailroom.messages DROP CONSTRAINT IF EXISTS messages_mailbox_id_fkey;
