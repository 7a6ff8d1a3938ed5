-- Bounces (issue 15, part 1): VERP return paths and asynchronous bounce reports (DSNs).
--
-- Outbound mail's envelope sender becomes bounce+<message id>-<signature>@<bounce domain> when a
-- bounce domain is set (per sender, else the setting outbound.bounce_domain; none: no VERP). The
-- signature is a truncated HMAC of the message id under mailroom.verp_key, a random key made here
-- and read only inside SECURITY DEFINER functions (like mailroom.redaction_pepper): no function
-- returns it, no runtime role can read it. `mailroom inbox serve` accepts mail for these
-- addresses and hands the parsed report to mailroom.record_bounce (sql/26_bounces.sql).

CREATE TABLE mailroom.verp_key (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    key bytea NOT NULL CHECK (octet_length(key) >= 32)
);

COMMENT ON TABLE mailroom.verp_key IS
'The key of the VERP return path signatures (32 random bytes made by migration 0095). Owner only: returned by no function.';

INSERT INTO mailroom.verp_key (singleton, key)
VALUES (true, gen_random_bytes(32))
ON CONFLICT (singleton) DO NOTHING;

REVOKE ALL ON mailroom.verp_key FROM public;

-- The bounce domain of a sender; NULL: the setting outbound.bounce_domain applies.
ALTER TABLE mailroom.senders
ADD COLUMN bounce_domain text,
ADD CONSTRAINT senders_bounce_domain_check CHECK (
    bounce_domain IS null
    OR (
        bounce_domain = lower(bounce_domain)
        AND octet_length(bounce_domain) <= 253
        AND bounce_domain ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?([.][a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$'
    )
);

COMMENT ON COLUMN mailroom.senders.bounce_domain IS
'Domain of this sender''s VERP return paths (bounce+<id>-<sig>@domain); NULL: the setting outbound.bounce_domain.';

-- Empty (the default): no VERP; the envelope sender is the sender's from_address, as before.
-- Kind text because a domain setting cannot be emptied again; sql/26_bounces.sql uses the value
-- only when it is a domain name (anything else counts as empty: no VERP).
INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES (
    'outbound.bounce_domain', '',
    'domain of VERP return paths (bounce+<id>-<signature>@domain) for senders without their own; empty: no VERP',
    'text', '0', '253'
)
ON CONFLICT (name) DO NOTHING;

-- What bounce reports said about outbound messages: one row per report line (a recipient of a
-- DSN), or one 'unparsed' row for a report nothing could be read from. No address: the
-- recipient is its position in the message (to[1], cc[2]); diagnostics pass through
-- mailroom.redact_pii. message_id is outbound_messages.id, not a foreign key (that table is
-- partitioned and purged; its bounces may outlive it). The bounce mail itself is not kept.
CREATE TABLE mailroom.outbound_bounces (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id bigint NOT NULL,
    received_at timestamptz NOT NULL,
    outcome text NOT NULL,
    recipient text,
    action text,
    status text,
    smtp_code integer,
    diagnostic text,
    CONSTRAINT outbound_bounces_outcome_check CHECK (
        outcome IN ('hard_bounce', 'soft_bounce', 'delayed', 'other', 'ignored', 'unparsed')
    )
);

COMMENT ON TABLE mailroom.outbound_bounces IS
'Bounce reports per outbound message (hard_bounce, soft_bounce, delayed, other, ignored, unparsed); recipients as positions, diagnostics redacted.';

CREATE INDEX outbound_bounces_message_idx ON mailroom.outbound_bounces (message_id, id);

-- claim_messages returns one more column (return_path): a result type cannot change with
-- CREATE OR REPLACE, so the old version goes here and sql/33_outbound_claim.sql creates the new
-- one with its comment and grant.
DROP FUNCTION IF EXISTS mailroom.claim_messages(integer, text, bytea, interval);
