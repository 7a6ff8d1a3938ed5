-- Issue 22: the claim is static SQL (sql/33_outbound_claim.sql): the functions that built its text
-- (spliced at markers, and a cached copy generated with format) give way to _outbound_due, _claim and
-- _claim_limited_due(timestamptz, integer).
DROP FUNCTION IF EXISTS mailroom._claim_cached(timestamptz, integer, text, interval, bytea);
DROP FUNCTION IF EXISTS mailroom._claim_statement(boolean);
DROP FUNCTION IF EXISTS mailroom._claim_limited_due();
DROP FUNCTION IF EXISTS mailroom._claim_limited_counted();
