-- Locks only mailroom's roles can take (issue 21, item 4). Advisory locks are global to the server:
-- any login, with no mailroom role at all, could take pg_advisory_lock on the same keys and so
-- make maintain_partitions skip forever, hold a domain's deliveries or block recovery requests.
-- A row lock needs UPDATE on the table, which no runtime role has: only mailroom's SECURITY
-- DEFINER functions, running as the owner, can take one.
--
-- mailroom.job_locks: one row per job of which one caller at a time may run (FOR UPDATE SKIP
-- LOCKED: a second caller skips instead of waiting). mailroom.domain_locks: one row per recipient
-- domain a capped claim has seen, the per-domain claim lock (sql/39_outbound_domain_limits.sql);
-- not domain_state itself, which the claim statement updates in the same command.

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
    domain text PRIMARY KEY
);

COMMENT ON TABLE mailroom.domain_locks IS
'The per-domain claim lock of the domain limits: claim_messages locks a domain''s row FOR UPDATE SKIP LOCKED (created on the first capped claim of the domain).';
