-- Issue 21, item 2 and issue 27, items 1-3: a return path names the recipient it was issued for.
--
-- A return path becomes bounce+<message id>-<recipient>-<signature>@<bounce domain>, where
-- <recipient> is the position (1-based) of the recipient in the message's envelope (to, cc, bcc,
-- each address once, in order) and the signature is a truncated HMAC of both under
-- mailroom.verp_key (sql/36_outbound_bounces.sql). With VERP on, the sender makes one SMTP
-- transaction per recipient (as Postfix's VERP does), so a recipient sees only its own return
-- path, and a report sent to it can suppress only that recipient. The same scheme signs the
-- one-click unsubscribe links and mailto addresses of bulk mail (sql/36_outbound_unsubscribe.sql).
--
-- A signature suppresses at most once: the first suppression it causes is recorded here (by
-- reason), so a replayed report after an admin removed the entry does nothing.
CREATE TABLE mailroom.spent_signatures (
    message_id bigint NOT NULL,
    recipient integer NOT NULL CHECK (recipient >= 1),
    reason text NOT NULL CHECK (reason IN ('hard_bounce', 'complaint', 'unsubscribe')),
    spent_at timestamptz NOT NULL,
    PRIMARY KEY (message_id, recipient, reason)
);

COMMENT ON TABLE mailroom.spent_signatures IS
'Per-recipient signatures (return paths, unsubscribe tokens) that have suppressed their recipient once, by reason: '
'a replay suppresses nothing. No address: the recipient is its envelope position in outbound_messages.id.';

REVOKE ALL ON mailroom.spent_signatures FROM public;

-- Bulk mail (enqueue_bulk_message): it carries List-Unsubscribe (RFC 8058). mailroom's own
-- emails (activation, recovery) never are.
ALTER TABLE mailroom.outbound_messages
ADD COLUMN bulk boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN mailroom.outbound_messages.bulk IS
'Marked bulk at enqueue (enqueue_bulk_message): sent with List-Unsubscribe and List-Unsubscribe-Post (RFC 8058).';

-- reasons the signed paths add: unsubscribe (one-click or mailto)
ALTER TABLE mailroom.suppressions
DROP CONSTRAINT suppressions_reason_check,
ADD CONSTRAINT suppressions_reason_check CHECK (reason IN ('hard_bounce', 'complaint', 'manual', 'unsubscribe'));

-- DKIM (RFC 6376): per sender domain, the selector and the public half; the private key lives
-- only where `mailroom send` runs (MAILROOM_DKIM_KEY_FILE).
CREATE TABLE mailroom.dkim_keys (
    domain text PRIMARY KEY CHECK (
        domain = lower(domain)
        AND octet_length(domain) <= 253
        AND domain ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?([.][a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$'
    ),
    selector text NOT NULL CHECK (selector ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?([.][a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$'),
    -- the public key as the DNS record's p= (base64 of the DER SubjectPublicKeyInfo)
    public_key text NOT NULL CHECK (public_key ~ '^[A-Za-z0-9+/]+=*$' AND length(public_key) <= 4096),
    algorithm text NOT NULL CHECK (algorithm IN ('rsa-sha256', 'ed25519-sha256')),
    created_at timestamptz NOT NULL
);

COMMENT ON TABLE mailroom.dkim_keys IS
'DKIM signing per From domain: selector and public half (the DNS TXT record''s p=). The private half never reaches the database.';

REVOKE ALL ON mailroom.dkim_keys FROM public;

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES
(
    'outbound.unsubscribe_base_url', '',
    'https base URL of the HTTP face for one-click unsubscribe links (<base>/unsubscribe/<token>); empty: mailto only',
    'text', '0', '2000'
),
(
    'outbound.feedback_address', '',
    'address (at a bounce domain) where ARF complaint reports arrive besides the return paths; empty: none',
    'text', '0', '254'
)
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR380', 'outbound', 'not_found', 'not a valid unsubscribe token (unknown message or bad signature)', null, null),
('MR381', 'outbound', 'usage', 'a DKIM selector must be a DNS label sequence', null, null),
('MR382', 'outbound', 'usage', 'a DKIM public key must be base64 (the record''s p=) of an rsa-sha256 or ed25519-sha256 key', null, null),
('MR383', 'outbound', 'not_found', 'no DKIM key for that domain', null, null),
('MR384', 'outbound', 'usage', 'the unsubscribe request is not List-Unsubscribe=One-Click', null, null)
ON CONFLICT (code) DO NOTHING;

-- claim_messages gains the envelope (one recipient list, the order of the return paths), the
-- per-recipient return paths and List-Unsubscribe values, and the DKIM selector of the From
-- domain: its result changes, so it is dropped here and re-created by sql/33_outbound_claim.sql
-- in the same transaction (the keyed form of the previous release is rebuilt on top of it).
DROP FUNCTION IF EXISTS mailroom.claim_messages(integer, text, bytea, interval);
DROP FUNCTION IF EXISTS mailroom.claim_messages(integer, text, interval);
DROP FUNCTION IF EXISTS mailroom._claim(timestamptz, integer, text, interval, boolean);

-- what a report to a signed address can be besides a DSN: an ARF complaint, an unsubscribe
ALTER TABLE mailroom.outbound_bounces
DROP CONSTRAINT outbound_bounces_outcome_check,
ADD CONSTRAINT outbound_bounces_outcome_check CHECK (
    outcome IN (
        'hard_bounce', 'soft_bounce', 'delayed', 'other', 'ignored', 'unparsed', 'complaint', 'unsubscribe', 'spent'
    )
);
