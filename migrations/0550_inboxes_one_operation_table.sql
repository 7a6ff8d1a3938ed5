-- Issue 43: one declaration per inbox operation (driver/mailroom/api/operations.py). MCP calls the
-- http_* functions REST calls; http_create_mailbox takes the face (p_face, 'mcp': owner type mcp),
-- so its old four-argument form goes (sql/29_http.sql re-creates it with the new trailing DEFAULT
-- argument: an old call resolves to it, docs/upgrading.md), and the MCP face's own lookups go with
-- the queries of sql/26_mcp.sql, now thin deprecated wrappers.
DROP FUNCTION IF EXISTS mailroom.http_create_mailbox(bytea, text, integer, text);
DROP FUNCTION IF EXISTS mailroom_internal._mcp_owner(bytea);
DROP FUNCTION IF EXISTS mailroom_internal._mcp_box(text, bytea);
