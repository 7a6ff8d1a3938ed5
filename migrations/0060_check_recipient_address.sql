-- check_recipient returns its verdict together with the normalized address (RETURNS TABLE
-- (verdict, address)), so the inbound server de-duplicates recipients by the form the mailboxes
-- are keyed on. A result type cannot change with CREATE OR REPLACE: drop the text-returning
-- version here; sql/20_mailboxes.sql creates the new one.
DROP FUNCTION IF EXISTS mailroom.check_recipient(text, bigint);
