-- show_outbound_message also returns suppressed_recipients (the positions enqueue dropped, see
-- migration 0090): a result type cannot change with CREATE OR REPLACE, so the old version goes
-- here and sql/35_outbound_admin.sql creates the new one with its comment and grant.
DROP FUNCTION IF EXISTS mailroom.show_outbound_message(bigint);
