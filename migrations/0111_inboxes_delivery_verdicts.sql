-- Issue 22: the inbound server gets its verdicts and SMTP replies from SQL. check_bounce_recipient
-- answers the reply of a refusing verdict as a third column, and deliver_messages one row per message
-- with its verdict and reply. A result type cannot change with CREATE OR REPLACE: the old versions
-- go here, and sql/ creates the new ones with their comments and grants.
DROP FUNCTION IF EXISTS mailroom.check_bounce_recipient(text, bigint);
DROP FUNCTION IF EXISTS mailroom.deliver_messages(integer[], text[], bytea[], text[], text[], text[], text[], text[], jsonb[]);
