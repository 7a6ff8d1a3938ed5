-- Every installation's outbound queue has a lane (issue 46, Citus near one node): one node is one
-- lane, 0, so the statements that act on a claim's rows (finalize_messages, release_messages,
-- sql/34) are one text everywhere and name the lanes the claim tokens carry (_claim_lanes, a
-- seam). A default, so no row is rewritten. On Citus the column was added when the queue was
-- distributed (sql/citus/10, by lane): nothing is done there (even a no-op ALTER TABLE of a
-- distributed table is a parallel operation, after which the transaction may not create functions).
DO $lane$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_attribute AS a
        WHERE a.attrelid = 'mailroom.outbound_messages'::regclass AND a.attname = 'lane' AND NOT a.attisdropped
    ) THEN
        ALTER TABLE mailroom.outbound_messages ADD COLUMN lane integer NOT NULL DEFAULT 0;
        COMMENT ON COLUMN mailroom.outbound_messages.lane IS
        'The lane the message is queued on: 0 on one node; on Citus the distribution column, one lane a shard (outbound_lanes), at random when queued.';
    END IF;
END;
$lane$;
