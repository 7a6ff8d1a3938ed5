-- Password recovery requests (issue 21, items 4, 6 and 7): request_password_recovery only records
-- the request, whatever the address, so a request for an existing account and one for an unknown
-- address run the same statements on the same pages; dequeue_tokens (the collector) turns
-- pending requests into tokens under the recovery policy (docs/accounts.md, "Recovery policy").
-- No advisory lock: the processing locks the request rows (SKIP LOCKED) and the account's row.

CREATE TABLE mailroom.recovery_requests (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    requested_at timestamptz NOT NULL DEFAULT mailroom._clock_default(),
    -- the address as requested (lower case) while the request waits; NULL once handled
    email text,
    -- sha256 of the requester fingerprint the application passed (NULL: anonymous)
    requester_digest bytea,
    handled_at timestamptz,
    -- set when a token was issued for the request: its account and token
    account bigint,
    token_id bigint,
    CONSTRAINT recovery_requests_pending_holds_email CHECK ((handled_at IS null) = (email IS NOT null)),
    CONSTRAINT recovery_requests_email_length CHECK (octet_length(email) <= 320),
    CONSTRAINT recovery_requests_issued CHECK ((token_id IS null) = (account IS null))
);

COMMENT ON TABLE mailroom.recovery_requests IS
'Password recovery requests: pending (the address kept until handled), then, when a token was issued, its account and requester for the recovery policy; other handled requests are deleted.';

-- the pending requests, in order (dequeue_tokens reads them)
CREATE INDEX recovery_requests_pending_idx ON mailroom.recovery_requests (id)
WHERE handled_at IS null;

-- the recovery policy counts an account's issued tokens per requester in its window
CREATE INDEX recovery_requests_issued_idx ON mailroom.recovery_requests (account, handled_at)
WHERE token_id IS NOT null;

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'recovery.requester_daily_cap', '3',
    'Recovery tokens per account in 24 hours issued at the requests of one requester fingerprint (p_requester of request_password_recovery).',
    'integer', '1', '1000'
),
(
    'recovery.capped_interval', '1 hour',
    'Past recovery.daily_cap, one more recovery token per account per this interval: strangers can delay its owner by this much, never lock them out.',
    'interval', '1 minute', '1 day'
)
ON CONFLICT (name) DO NOTHING;

-- The daily cap bounds mail to the address; the requester cap now keeps one stranger from using it.
UPDATE mailroom.settings
SET
    value = '10',
    description = 'Recovery tokens per account in 24 hours, all requesters together (then one per recovery.capped_interval).'
WHERE name = 'recovery.daily_cap' AND value = '5';

UPDATE mailroom.settings
SET description = 'Minimum time between two recovery tokens of one account issued at the requests of one requester (anonymous requests are one requester).'
WHERE name = 'recovery.min_interval';

-- and leave two days after they were handled (the oldest first)
CREATE INDEX recovery_requests_handled_idx ON mailroom.recovery_requests (handled_at)
WHERE token_id IS NOT null;

-- request_password_recovery gains p_requester (sql/13_recovery.sql re-creates it)
DROP FUNCTION IF EXISTS mailroom.request_password_recovery(text);
