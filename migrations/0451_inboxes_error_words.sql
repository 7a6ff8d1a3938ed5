-- Issue 43, item 3 (the faces' error slips): MR202's meaning, which MCP's extend_inbox description
-- quotes, spoke of minutes while extending takes seconds (REST's ttl_seconds, MCP's ttl_seconds).
UPDATE mailroom.error_codes
SET meaning = 'a TTL that is not a positive number (minutes when an inbox is created, seconds when it is extended)'
WHERE code = 'MR202';
