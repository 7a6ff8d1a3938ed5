-- Issue 33, item 6: the HTTP face (`mailroom http serve`) reports a heartbeat like every other
-- long-running command, so `mailroom status` and mailroom.worker_health() list it. Its kind is a
-- row of mailroom.worker_kinds; sql/06_queue_health.sql grants worker_heartbeat and worker_stopped
-- to mailroom_http (nothing else: its inboxes expire by `mailroom expire`, run's expire worker).

INSERT INTO mailroom.worker_kinds (kind, command, description) VALUES
('http', 'mailroom http serve', 'the HTTP face: REST API, inbox page, live events, SES hook')
ON CONFLICT (kind) DO NOTHING;
