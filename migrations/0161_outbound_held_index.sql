-- mailroom:no-transaction
-- Issue 23: the held outbound messages (migration 0160), found without reading the queue: the
-- maintenance's liveness probe of a partition, `mailroom outbound release --all`, `list --status
-- held`. Outside a transaction because an enum value ('held') can only be used once the
-- transaction that added it has committed. Held rows are few: the build reads each partition once.
CREATE INDEX IF NOT EXISTS outbound_messages_held_idx ON mailroom.outbound_messages (id) WHERE status = 'held';
-- the partitions' copies get the house's names (<partition>_held_idx) where sql/ is already in place
DO $$ BEGIN IF pg_catalog.to_regprocedure('mailroom._name_partition_indexes(text)') IS NOT NULL THEN PERFORM mailroom._name_partition_indexes('outbound_messages'); END IF; END $$;
