-- finalize_messages also returns, per row, the kind it decided (sent, transient, permanent) and
-- the reply class the sender labels its metrics with, so the classification lives in SQL only.
-- A result type cannot change with CREATE OR REPLACE: drop the old version here;
-- sql/34_outbound_finalize.sql creates the new one.
DROP FUNCTION IF EXISTS mailroom.finalize_messages(bigint[], bigint[], text[], integer[], text[], text[]);
