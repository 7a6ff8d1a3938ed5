-- The waits' caps per client address (the attacker review after issue 45, MED: every anonymous inbox
-- has a session token of its own, so one client making anonymous inboxes, within http.create_limit, and
-- waiting on each could take the whole wait.max_total and refuse every other owner, MR252). A server
-- process now counts its waits and event streams per client address too (the address it sees, the
-- reverse proxy's X-Forwarded-For with --proxy); over: MR253. wait_caps answers the new column
-- (per_client, last): its result changes, so it is dropped here and sql/25_waiting.sql re-creates it in
-- the same transaction.
DROP FUNCTION IF EXISTS mailroom.wait_caps();

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES
(
    'wait.max_per_client', '200',
    'waits (REST long polls, MCP wait_for_message) one client address may hold at once in one server process, '
    || 'whatever its credentials; over it MR253',
    'integer', '1', '1000000'
),
(
    'events.max_per_client', '1000',
    'event streams (GET …/events) one client address may hold at once in one server process, whatever its '
    || 'credentials; over it MR253',
    'integer', '1', '1000000'
)
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
(
    'MR253', 'inboxes', 'limit',
    'too many waits or event streams from this client address in this server process (wait.max_per_client, '
    || 'events.max_per_client)',
    null, null, 429
)
ON CONFLICT (code) DO NOTHING;
