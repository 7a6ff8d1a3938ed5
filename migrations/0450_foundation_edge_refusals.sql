-- Issue 43, item 3: every edge bounded in one place, before any work (driver/mailroom/http/edge.py).
-- The faces' edge refuses a request before any route reads it; mailroom.edge_refusal (sql/04_edge.sql)
-- raises each refusal with its code, and these rows give each its HTTP status.
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
('MR030', 'foundation', 'limit', 'the request body is over the route''s bound', null, null, 413),
('MR031', 'foundation', 'usage', 'the request holds a NUL character (%00, or \u0000 in a JSON string)', null, null, 400),
('MR032', 'foundation', 'usage', 'the path, query or form is not valid UTF-8 once percent-decoded', null, null, 400),
('MR033', 'foundation', 'usage', 'the JSON body nests deeper than the edge allows', null, null, 400)
ON CONFLICT (code) DO NOTHING;
