-- The sink (issue 44 item 1, docs/inboxes.md "The sink"): with the sink on (setting inbox.sink, or
-- `inbox serve --sink`), every recipient at every domain gets an inbox at RCPT, plan sink, owner type
-- anonymous, marked catchall_domain '*'; at most sink.max_inboxes open and sink.max_bytes stored,
-- past either the oldest is let go. Catch-all domains may also be subdomain patterns (*.example.com).
-- Functions: sql/24_catchall.sql, sql/21_delivery.sql, sql/20_mailboxes.sql.

-- What a full inbox does with one more message: refuse it (552 5.2.2, every plan until now), or let
-- its oldest message go (issue 44 item 4 wants it per plan; the sink's plan does).
-- (the column and its CHECK in two statements: Citus refuses ADD COLUMN with a constraint on a table
-- it already distributes, as an upgraded Citus installation's are)
ALTER TABLE mailroom.plans ADD COLUMN when_full text NOT NULL DEFAULT 'refuse';
ALTER TABLE mailroom.plans ADD CONSTRAINT plans_when_full_check CHECK (when_full IN ('refuse', 'drop_oldest'));

COMMENT ON COLUMN mailroom.plans.when_full IS
'A full inbox (max_messages): refuse the next message, or drop_oldest (its oldest message is let go to make room).';

-- The bytes an inbox holds (the sum of its messages' size_bytes): kept by deliver_message, the deletes
-- and the let-go of drop_oldest, so the sink's byte cap reads a column per inbox, not its messages.
ALTER TABLE mailroom.mailboxes ADD COLUMN stored_bytes bigint NOT NULL DEFAULT 0;
ALTER TABLE mailroom.mailboxes ADD CONSTRAINT mailboxes_stored_bytes_check CHECK (stored_bytes >= 0);

COMMENT ON COLUMN mailroom.mailboxes.stored_bytes IS
'Bytes of the messages the inbox holds (raw size), kept with message_count; the sink''s sink.max_bytes sums it.';

INSERT INTO mailroom.plans (
    name, default_ttl_minutes, max_ttl_minutes, max_message_bytes, max_messages, when_full
) VALUES ('sink', 1440, 1440, 10485760, 1000, 'drop_oldest')
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value) VALUES
(
    'inbox.sink', 'false',
    'The sink for development and CI: every recipient at every domain gets an inbox at RCPT (plan sink), for every inbound server on this database (`inbox serve --sink` turns it on for one server).',
    'boolean', null, null
),
(
    'sink.max_inboxes', '1000',
    'Open sink inboxes at most: a new one past it lets the oldest go (expired).',
    'integer', '1', '1000000'
),
(
    'sink.max_bytes', '536870912',
    'Bytes stored in open sink inboxes at most (512 MiB): past it the oldest sink inboxes are let go (expired).',
    'integer', '1048576', '1099511627776'
)
ON CONFLICT (name) DO NOTHING;

-- RCPT's call takes the inbound server's --sink (a defaulted argument at the end: the previous
-- release's two-argument calls resolve to the new form); sql/24 and sql/36 re-create them.
DROP FUNCTION IF EXISTS mailroom.check_bounce_recipient(text, bigint);
DROP FUNCTION IF EXISTS mailroom_internal._check_recipient_fault(text, bigint);
DROP FUNCTION IF EXISTS mailroom_internal._check_recipient_or_claim(text, bigint);

-- the sink's inbox creations take turns on this row (sql/24_catchall.sql, _sink_claim), so
-- sink.max_inboxes is exact (no advisory lock: any login could take one)
INSERT INTO mailroom.job_locks (name, description) VALUES
('sink_claim', 'mailroom_internal._sink_claim(): sink inboxes are created one at a time, so sink.max_inboxes holds')
ON CONFLICT (name) DO NOTHING;
