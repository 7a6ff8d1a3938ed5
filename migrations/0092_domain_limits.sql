-- Per-destination-domain limits (issue 15, part 2): how many messages of one recipient domain
-- may be in flight at once and how many may be claimed per minute, plus the per-domain state
-- the claim and finalize keep (the current minute's count, a backoff after the domain throttled).
-- The rules are in sql/33_outbound_claim.sql and sql/34_outbound_finalize.sql; docs/limits.md.

-- The recipient domain of a message: the domain of its first recipient (to, then cc, then bcc),
-- lower case, without a trailing dot; filled by enqueue_message. A row inserted outside the API
-- has '' (unknown), which the '*' row governs.
ALTER TABLE mailroom.outbound_messages
ADD COLUMN rcpt_domain text NOT NULL DEFAULT '';

COMMENT ON COLUMN mailroom.outbound_messages.rcpt_domain IS
'Domain of the first recipient (to, cc, bcc), normalized; the domain limits count the message against it.';

UPDATE mailroom.outbound_messages AS m
SET rcpt_domain = lower(rtrim(split_part(lower(btrim(btrim((m.to_addrs || m.cc_addrs || m.bcc_addrs)[1]), '<>')), '@', 2), '.'))
WHERE cardinality(m.to_addrs || m.cc_addrs || m.bcc_addrs) > 0;

-- claim counts the in-flight rows of one domain through this index (processing rows are few).
CREATE INDEX outbound_messages_processing_domain_idx
ON mailroom.outbound_messages (rcpt_domain)
WHERE status = 'processing';

CREATE TABLE mailroom.domain_limits (
    -- '*' (every domain), 'example.com' (that domain only) or '*.example.com' (its subdomains,
    -- at any depth, not example.com itself); lower case, no trailing dot
    pattern text PRIMARY KEY,
    -- NULL: no limit
    max_in_flight integer,
    max_per_minute integer,
    updated_at timestamptz NOT NULL DEFAULT mailroom._clock_default(),
    CONSTRAINT domain_limits_pattern_check CHECK (
        pattern = '*'
        OR pattern ~ '^([*][.])?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?([.][a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$'
    ),
    CONSTRAINT domain_limits_in_flight_check CHECK (max_in_flight > 0),
    CONSTRAINT domain_limits_per_minute_check CHECK (max_per_minute > 0)
);

COMMENT ON TABLE mailroom.domain_limits IS
'Per recipient domain limits: max in flight (processing) and max claimed per minute; the most specific pattern wins, * is the default.';

-- (updated_at given: on a fresh database mailroom.clock() does not exist before the sql/ pass)
INSERT INTO mailroom.domain_limits (pattern, max_in_flight, max_per_minute, updated_at)
VALUES ('*', null, null, now())
ON CONFLICT (pattern) DO NOTHING;

CREATE TABLE mailroom.domain_state (
    domain text PRIMARY KEY,
    -- the minute (date_trunc of mailroom.clock()) window_count counts claims in
    window_start timestamptz,
    window_count integer NOT NULL DEFAULT 0,
    -- claim skips the domain until then (set by finalize after a throttling 4xx)
    backoff_until timestamptz,
    -- consecutive throttling episodes; 0 after a success
    backoff_level integer NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT mailroom._clock_default(),
    CONSTRAINT domain_state_window_count_check CHECK (window_count >= 0),
    CONSTRAINT domain_state_backoff_level_check CHECK (backoff_level >= 0)
);

COMMENT ON TABLE mailroom.domain_state IS
'Per recipient domain: claims in the current minute, and the backoff after the domain throttled (4xx).';

CREATE INDEX domain_state_backoff_idx
ON mailroom.domain_state (backoff_until)
WHERE backoff_until IS NOT null;

-- claim looks up the domains already counted in the current minute
CREATE INDEX domain_state_window_idx
ON mailroom.domain_state (window_start);

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'outbound.domain_backoff_base', '1 minute',
    'backoff of a domain after its first throttling reply (421, 4.7.x, greylisting); doubles per episode',
    'interval', '1 second', '1 day'
),
(
    'outbound.domain_backoff_max', '1 hour',
    'upper bound of a domain backoff (equal to outbound.domain_backoff_base: a fixed backoff)',
    'interval', '1 second', '7 days'
)
ON CONFLICT (name) DO NOTHING;

-- _claim_statement and _explain_claim gain a p_limited argument: the old ones go here,
-- sql/33_outbound_claim.sql creates the new ones.
DROP FUNCTION IF EXISTS mailroom._claim_statement();
DROP FUNCTION IF EXISTS mailroom._explain_claim(integer);
