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

-- A claim token on Citus carries the lane its rows were claimed from (issue 46): bit 62 marks it,
-- the lane is its low 16 bits, a nextval of the claim token sequence the bits between (so tokens
-- still grow with time, as the capped claims' bookkeeping compares them, sql/citus/20). Finalize and
-- release name the lanes of their tokens (_claim_lanes below, the seam of sql/34), so Citus writes
-- those lanes' shards only: a batch claimed from one lane commits on one worker in one phase, not
-- on every worker in two. A token without the mark (taken before this release, in flight across an
-- upgrade) names no lane: its statement covers every lane, as before.
CREATE OR REPLACE FUNCTION mailroom_internal._lane_claim_token(p_lane integer)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_lane NOT BETWEEN 0 AND 65535 THEN
        -- a lane that does not fit (never made by sql/citus/10): a token without the mark
        RETURN nextval('mailroom.outbound_claim_token_seq');
    END IF;
    RETURN (1::bigint << 62) | (nextval('mailroom.outbound_claim_token_seq') << 16) | p_lane;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._lane_claim_token(integer) IS
'Citus only: a new claim token for a claim in this lane, carrying the lane (bit 62 set, the lane in the low 16 bits).';

REVOKE ALL ON FUNCTION mailroom_internal._lane_claim_token(integer) FROM public;

CREATE OR REPLACE FUNCTION mailroom_internal._claim_lanes(p_claim_tokens bigint[])
RETURNS integer[]
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN bool_and(t.token IS NOT NULL AND t.token >= (1::bigint << 62))
            THEN array_agg(DISTINCT (t.token & 65535)::integer)
    END
    FROM unnest(p_claim_tokens) AS t (token)
$$;

COMMENT ON FUNCTION mailroom_internal._claim_lanes(bigint[]) IS
'Internal (Citus form of the seam of sql/34): the lanes the claim tokens carry; NULL (any lane) when one of them carries none or there is none.';
