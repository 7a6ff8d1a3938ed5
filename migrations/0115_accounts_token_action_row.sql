-- _token_action (sql/11_tokens.sql) answers its row as OUT columns instead of the table's row
-- type (so the sql/ pass applies to a schema of any version): a result cannot change with CREATE OR
-- REPLACE; sql/ re-creates it.
DROP FUNCTION IF EXISTS mailroom._token_action(mailroom.token_action);
