-- Issue 23, item 2: an honest status. Every long-running command registers as a worker (the inbound
-- SMTP server and the maintenance worker too), says where its Prometheus metrics are and what it
-- serves, and marks itself stopped on a clean exit; a worker whose heartbeat lapsed is lost
-- (sql/06_queue_health.sql). The kinds are data: a new long-running command adds its row.

CREATE TABLE mailroom.worker_kinds (
    kind text PRIMARY KEY CHECK (kind ~ '^[a-z][a-z_]{0,30}$'),
    command text NOT NULL CHECK (command ~ '^mailroom '),
    description text NOT NULL CHECK (description <> '')
);

COMMENT ON TABLE mailroom.worker_kinds IS
'The kinds of worker that report in through worker_heartbeat: the command that runs each and what it does.';

INSERT INTO mailroom.worker_kinds (kind, command, description) VALUES
('collector', 'mailroom collect', 'dequeues activation and recovery tokens (and renders their emails with --enqueue)'),
('sender', 'mailroom send', 'claims outbound messages and delivers them over SMTP'),
('inbound', 'mailroom inbox serve', 'the inbound SMTP server: stores mail for open inboxes, records bounces'),
('expiry', 'mailroom expire', 'expires inboxes at their expiry and purges them later'),
('maintenance', 'mailroom maintain --every', 'creates time partitions ahead and drops those past retention')
ON CONFLICT (kind) DO NOTHING;

ALTER TABLE mailroom.workers DROP CONSTRAINT IF EXISTS workers_kind_check;

ALTER TABLE mailroom.workers
ADD CONSTRAINT workers_kind_fkey FOREIGN KEY (kind) REFERENCES mailroom.worker_kinds (kind),
ADD COLUMN stopped_at timestamptz,
ADD COLUMN metrics_address text CONSTRAINT workers_metrics_address_check CHECK (length(metrics_address) <= 200),
ADD COLUMN serves text CONSTRAINT workers_serves_check CHECK (length(serves) <= 200);

COMMENT ON COLUMN mailroom.workers.stopped_at IS
'When the worker said it stopped (a clean exit); NULL while it runs or if it died without saying so.';
COMMENT ON COLUMN mailroom.workers.metrics_address IS
'host:port of the worker''s Prometheus endpoint (GET /metrics), NULL when it serves none.';
COMMENT ON COLUMN mailroom.workers.serves IS
'What the worker serves, for operators (e.g. smtp 127.0.0.1:2525); never an address or a secret.';

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'workers.lost_after', '1 minute',
    'A running worker without a heartbeat for this long is shown as lost (workers beat about every 10 seconds).',
    'interval', '15 seconds', '1 day'
),
(
    'workers.forget_stopped_after', '1 hour',
    'A worker that stopped cleanly is removed from mailroom.workers this long after it stopped.',
    'interval', '1 minute', '30 days'
)
ON CONFLICT (name) DO NOTHING;

-- The last run of each periodic job, whoever ran it (a worker, pg_cron, an operator): `mailroom
-- status` shows the last maintenance.
CREATE TABLE mailroom.job_runs (
    job text PRIMARY KEY,
    last_run_at timestamptz NOT NULL,
    last_summary text NOT NULL,
    runs bigint NOT NULL DEFAULT 1 CHECK (runs > 0)
);

COMMENT ON TABLE mailroom.job_runs IS
'The last completed run of each periodic job (maintain_partitions): when, what it did, how many runs so far.';

-- worker_heartbeat gains the metrics address and what the worker serves; worker_health the state
-- (running, lost, stopped). Re-created by sql/06_queue_health.sql.
DROP FUNCTION IF EXISTS mailroom.worker_heartbeat(text, text, boolean, integer);
DROP FUNCTION IF EXISTS mailroom.worker_health();
