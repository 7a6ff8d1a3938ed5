-- Issue 34: nothing doubled when the inbound server loses the answer to its delivering statement.
-- A connection lost after deliver_messages was sent leaves its outcome unknown to the server,
-- which used to answer 451 (a possible duplicate beats a lost message): the client retried a
-- message already stored. Now every delivering statement leaves a receipt, under a key the
-- inbound server chose, in the same transaction; on a lost answer the server asks for the
-- receipt on another connection (mailroom.settle_delivery) and answers what was decided. Asking
-- inserts a tombstone under the key when none is there, so a delivery still in flight can no
-- longer commit: the answer is final either way. Receipts are deleted after a day by
-- maintain_partitions.
CREATE TABLE mailroom.delivery_receipts (
    key uuid PRIMARY KEY,
    replies text[],
    created_at timestamptz NOT NULL
);

-- maintain_partitions deletes them by age: a BRIN index costs the accept path next to nothing
CREATE INDEX delivery_receipts_created_at_idx ON mailroom.delivery_receipts USING brin (created_at);

COMMENT ON TABLE mailroom.delivery_receipts IS
'One row per delivering statement of the inbound server (its key): the SMTP replies it decided, in message order; replies NULL: a tombstone (settle_delivery found no delivery under the key; none can commit under it any more).';

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR217', 'inboxes', 'usage', 'a delivery receipt''s key must not be null', null, null)
ON CONFLICT (code) DO NOTHING;
