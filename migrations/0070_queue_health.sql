-- Queue health: the workers that report in through mailroom.worker_heartbeat
-- (sql/36_queue_health.sql). One row per worker process, written only by its heartbeat; rows of
-- workers silent for longer than the setting workers.forget_after are removed by the next one.

CREATE TABLE mailroom.workers (
    worker text PRIMARY KEY CHECK (length(worker) BETWEEN 1 AND 200),
    kind text NOT NULL CHECK (kind IN ('collector', 'sender', 'expiry')),
    host text NOT NULL,
    started_at timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    last_claim_at timestamptz,
    listening boolean NOT NULL,
    last_listening_at timestamptz,
    claimed bigint NOT NULL DEFAULT 0 CHECK (claimed >= 0)
);

COMMENT ON TABLE mailroom.workers IS
'Worker processes and their last heartbeat: whether their LISTEN connection hears, when they last claimed work.';
COMMENT ON COLUMN mailroom.workers.host IS
'The worker name up to its last colon (names are host:pid by default).';
COMMENT ON COLUMN mailroom.workers.last_listening_at IS
'Last heartbeat at which the worker''s listener heard NOTIFY (NULL: never; it polls).';
COMMENT ON COLUMN mailroom.workers.claimed IS
'Rows claimed (tokens, messages, inboxes) as reported by the heartbeats since the worker started.';

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'workers.forget_after', '1 day',
    'A worker without a heartbeat for this long (an interval) is removed from mailroom.workers.',
    'interval', '1 minute', '30 days'
)
ON CONFLICT (name) DO NOTHING;
