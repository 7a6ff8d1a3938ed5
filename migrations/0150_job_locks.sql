-- Locks only mailroom's roles can take (issue 21, item 4). Advisory locks are global to the server:
-- any login, with no mailroom role at all, could take pg_advisory_lock on the same keys and so
-- make maintain_partitions skip forever, hold a domain's deliveries or block recovery requests.
-- A row lock needs UPDATE on the table, which no runtime role has: only mailroom's SECURITY
-- DEFINER functions, running as the owner, can take one.
--
-- mailroom.job_locks: one row per job of which one caller at a time may run (FOR UPDATE SKIP
-- LOCKED: a second caller skips instead of waiting). mailroom.domain_locks: the per-domain claim
-- locks (sql/39_outbound_domain_limits.sql), 1024 rows made here, a domain's picked by its hash:
-- not a row per domain (the first claims of a new domain would wait for each other's INSERT),
-- not domain_state itself (the claim statement upserts it in the same command).

CREATE TABLE mailroom.job_locks (
    name text PRIMARY KEY,
    description text NOT NULL
);

COMMENT ON TABLE mailroom.job_locks IS
'One row per job run by one caller at a time; its functions lock the row FOR UPDATE SKIP LOCKED (no advisory lock).';

INSERT INTO mailroom.job_locks (name, description) VALUES
(
    'maintain_partitions',
    'mailroom.maintain_partitions(): a second caller while one runs returns skipped'
)
ON CONFLICT (name) DO NOTHING;

CREATE TABLE mailroom.domain_locks (
    bucket integer PRIMARY KEY,
    CONSTRAINT domain_locks_bucket_check CHECK (bucket BETWEEN 0 AND 1023)
);

COMMENT ON TABLE mailroom.domain_locks IS
'The per-domain claim locks of the domain limits: 1024 rows, a domain locks the one its hash picks (FOR UPDATE SKIP LOCKED in claim_messages). Rows exist beforehand, so taking one never waits for an insert.';

INSERT INTO mailroom.domain_locks (bucket)
SELECT b.bucket FROM generate_series(0, 1023) AS b (bucket)
ON CONFLICT (bucket) DO NOTHING;
