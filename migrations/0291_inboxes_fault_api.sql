-- Issue 35, item 5: fault injection from the API and MCP (sql/29_http.sql, sql/26_mcp.sql).
-- GET /api/v1/mailboxes/{address}/fault answers 404 with this code when no fault is in force.
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR270', 'inboxes', 'not_found', 'no fault is set for this inbox or its catch-all domain', null, null)
ON CONFLICT (code) DO NOTHING;
