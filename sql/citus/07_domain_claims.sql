-- The claims of capped domains not yet visible on the workers (Citus only; docs/scale.md,
-- "Per-domain caps"). A claim that writes on several nodes commits in two phases: the
-- coordinator commits first (its per-domain lock, in domain_locks, is free from then on) and
-- the workers' prepared transactions a moment later. A claimer taking the lock in between would
-- count the previous holder's rows as still queued and claim past the cap. So the claim of a
-- capped domain also writes its rows here, on the coordinator, in the transaction that holds the
-- lock: the next holder counts a row here as in flight while the worker still shows it as it
-- was before the claim (queued, the same attempts, an older token) and for 10 s at most (the
-- second phase takes milliseconds; a worker down in between is resolved by Citus' recovery).
-- A finalized, reaped or deleted row, or one claimed by that token, resolves it. Entries are
-- pruned by the next holder of the domain.
-- Placed on the coordinator by sql/citus/10_distribute.sql (a table it has not placed yet).

CREATE TABLE IF NOT EXISTS mailroom.outbound_domain_claims (
    domain text NOT NULL,
    message_id bigint NOT NULL,
    claim_token bigint NOT NULL,
    -- the row's attempts when claimed (a claim does not change them; finalize and reap do)
    attempts integer NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (domain, message_id, claim_token)
);

COMMENT ON TABLE mailroom.outbound_domain_claims IS
'Citus only: the rows a claim took for a capped domain, counted as in flight by the next holder of the domain''s lock until the workers show the claim (two-phase commit: the coordinator commits first).';
