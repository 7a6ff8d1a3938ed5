-- Issue 43, item 2: one wait behind REST's long poll, SSE, MCP and SQL's wait_for_message
-- (docs/architecture.md, "The wait"). A cursor (p_after_id: only a message with a greater id
-- answers) is a new last argument of wait_for_message and of the internal _newest_message: the
-- old signatures go here and sql/25_waiting.sql re-creates them with the argument defaulted, in the
-- same transaction (a defaulted argument beside the old signature would make the old call ambiguous).
DROP FUNCTION IF EXISTS mailroom.wait_for_message(text, text, interval, text, text, text);
DROP FUNCTION IF EXISTS mailroom_internal._newest_message(bigint, text);

-- the caps of a server process's waits (counted by the process, read through mailroom.wait_caps)
INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES
(
    'wait.max_per_credential', '100',
    'waits (REST long polls, MCP wait_for_message) one API key or session token may hold at once in one server process; over it MR251',
    'integer', '1', '100000'
),
(
    'wait.max_total', '2000',
    'waits (REST long polls, MCP wait_for_message) one server process holds at once; over it MR252',
    'integer', '1', '1000000'
),
(
    'events.max_per_credential', '500',
    'event streams (GET …/events) one API key or session token may hold at once in one server process; over it MR251',
    'integer', '1', '100000'
),
(
    'events.max_total', '6000',
    'event streams (GET …/events) one server process holds at once; over it MR252',
    'integer', '1', '1000000'
)
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
(
    'MR251', 'inboxes', 'limit',
    'too many waits or event streams for this credential in this server process (wait.max_per_credential, events.max_per_credential)',
    null, null, 429
),
(
    'MR252', 'inboxes', 'limit',
    'too many waits or event streams in this server process (wait.max_total, events.max_total)',
    null, null, 429
)
ON CONFLICT (code) DO NOTHING;
