-- consume_token reports a wrong recovery code as a result row, so the attempt it counts commits
-- with the caller's transaction; the autonomous dblink loopback that counted it is gone.
-- The result type changes (bigint -> TABLE (account, outcome, attempts_left)): drop the old
-- function here, sql/12_consume.sql creates the new one.

DROP FUNCTION IF EXISTS mailroom.consume_token(text, bytea, text, bytea[]);
DROP FUNCTION IF EXISTS mailroom._count_code_attempt(bigint);
DROP FUNCTION IF EXISTS mailroom._loopback_conninfo();

DELETE FROM mailroom.settings
WHERE name = 'tokens.loopback_conninfo';
