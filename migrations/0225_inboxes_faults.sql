-- Issue 35 item 5: fault injection per inbox (Mailpit's "chaos"). An inbox, or a catch-all domain,
-- answers an SMTP error of its owner's choice at RCPT, at the end of DATA (nothing stored), or after
-- DATA (stored, then the error), for every message, a share of them, or the next N. Decided in the
-- inbound server's own SQL calls (sql/24_faults.sql): check_bounce_recipient and deliver_messages.
-- Found at RCPT and DATA by the recipient's address (or its domain) alone: one probe of this small
-- table, no second look-up of the mailbox for the many recipients without a fault. No foreign key
-- to mailboxes (distributed by id on Citus, docs/scale.md): a fault found is checked against the id
-- of the inbox the address names now, so the fault of a purged inbox never fires for a new one.
CREATE TABLE mailroom.inbox_faults (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    mailbox_id bigint,
    address text,
    catchall_domain text,
    stage text NOT NULL CONSTRAINT inbox_faults_stage CHECK (stage IN ('rcpt', 'data', 'after_data')),
    -- one SMTP reply line: a 4xx/5xx code a server answers at RCPT or DATA, an enhanced status code
    -- of the same class (RFC 3463), and printable ASCII text: no CR, LF or other control character
    reply text NOT NULL CONSTRAINT inbox_faults_reply CHECK (
        reply ~ '^(421|450|451|452|550|551|552|553|554) [45][.][0-9]{1,3}[.][0-9]{1,3} [ -~]*[!-~]$'
        AND substr(reply, 1, 1) = substr(reply, 5, 1)
        AND length(reply) <= 200
    ),
    -- the percentage of messages it answers (random() per message); 100: every one
    share numeric(5, 2) NOT NULL DEFAULT 100 CONSTRAINT inbox_faults_share CHECK (share BETWEEN 0 AND 100),
    -- how many more times it answers (decremented by each answer, under the row lock); NULL: no end
    remaining integer CONSTRAINT inbox_faults_remaining CHECK (remaining >= 0),
    fired bigint NOT NULL DEFAULT 0 CHECK (fired >= 0),
    set_at timestamptz NOT NULL,
    CONSTRAINT inbox_faults_one_scope CHECK (
        (mailbox_id IS null) = (address IS null) AND (address IS null) <> (catchall_domain IS null)
    ),
    CONSTRAINT inbox_faults_address_key UNIQUE (address),
    CONSTRAINT inbox_faults_domain_key UNIQUE (catchall_domain)
);

COMMENT ON TABLE mailroom.inbox_faults IS
'Fault injection: an inbox (mailbox_id, its address) or a catch-all domain answers reply at stage (rcpt, data, after_data) for share % of messages, remaining more times (NULL: no end).';

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR230', 'inboxes', 'usage', 'a fault''s stage must be rcpt, data or after_data', null, null),
(
    'MR231', 'inboxes', 'usage',
    'a fault''s reply must be one line: a 4xx/5xx code (421, 450-452, 550-554), an enhanced status of the same class, and printable text',
    null, null
),
(
    'MR232', 'inboxes', 'usage',
    'a fault''s share must be a percentage from 0 to 100 and its count a positive number',
    null, null
),
('MR233', 'inboxes', 'not_found', 'not a catch-all domain', null, null)
ON CONFLICT (code) DO NOTHING;
