-- Lanes of the outbound queue on Citus (docs/scale.md): outbound_messages is distributed by lane,
-- and each lane value falls in a shard of its own (sql/citus/10_distribute.sql fills the table
-- from Citus' metadata), so a statement that names one lane runs on one shard, where
-- FOR UPDATE SKIP LOCKED works as on a single node. A message is queued on a random lane.

CREATE TABLE IF NOT EXISTS mailroom.outbound_lanes (
    lane integer PRIMARY KEY
);

COMMENT ON TABLE mailroom.outbound_lanes IS
'Citus only: the lanes of outbound_messages, one distribution value per shard; the claim takes work from one lane at a time.';

CREATE OR REPLACE FUNCTION mailroom_internal._outbound_lane()
RETURNS integer
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.lane FROM mailroom.outbound_lanes AS l ORDER BY random() LIMIT 1
$$;

COMMENT ON FUNCTION mailroom_internal._outbound_lane() IS
'Citus only: the lane a new outbound message is queued on (one of outbound_lanes, at random).';

REVOKE ALL ON FUNCTION mailroom_internal._outbound_lane() FROM public;
