-- The outbound queue on Citus: work is taken one lane (one shard) at a time.
--
-- Citus runs SELECT … FOR UPDATE SKIP LOCKED only on one shard: a statement whose every
-- distributed table is filtered on one lane value. So the claim of sql/33 is replaced here by a
-- loop over the lanes (mailroom.outbound_lanes), starting at a random lane so concurrent senders
-- spread over the shards; in each lane the statement is the single-node one with `lane = p_lane`
-- added, and SKIP LOCKED keeps every row to one claimer. The reaper of sql/34 keeps its one body
-- and runs its statement once a lane through the seam _outbound_scopes (below).
-- The due predicate (made by now included) and the result columns are those of sql/33 (_outbound_due, _claim): a
-- change there is made here too (tests/citus run the senders on this path); the row is the same
-- type, mailroom.claimed_message (migration 0250).
-- Per-domain caps (domain_limits): while a cap is set the claim first decides, on the
-- coordinator, how many rows each recipient domain it is about to meet may get (_lane_rooms:
-- the per-domain locks of sql/39, the counts taken under them), then claims lane by lane with
-- those rooms passed into the lane statement (_claim_lane_capped) and spent as lanes are
-- claimed (docs/scale.md, "Per-domain caps").

CREATE OR REPLACE FUNCTION mailroom_internal._claim_lane(
    p_lane integer, p_now timestamptz, p_limit integer, p_worker text, p_lease interval, p_blocked text[],
    p_claim_token bigint
)
RETURNS SETOF mailroom.outbound_messages
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    -- the lane is written into the text: Citus routes a statement to one shard by a constant
    -- (with a parameter in its place, the locking subquery has no distributed plan)
    RETURN QUERY EXECUTE format($sql$
    UPDATE mailroom.outbound_messages AS m
    SET
        status = 'processing',
        claimed_by = $3,
        claim_token = $6,
        claimed_at = $1,
        lease_expires_at = $1 + $4,
        updated_at = $1
    WHERE
        m.lane = %1$s
        AND (m.id, m.created_at) IN (
            SELECT d.id, d.created_at
            FROM mailroom.outbound_messages AS d
            WHERE
                d.lane = %1$s
                AND d.status = 'queued'
                AND coalesce(d.next_retry_at, '-infinity'::timestamptz) <= $1
                AND d.created_at <= $1
                AND d.rcpt_domain <> ALL($5)
            ORDER BY d.priority DESC, coalesce(d.next_retry_at, '-infinity'::timestamptz), d.id
            LIMIT $2
            FOR UPDATE SKIP LOCKED
        )
    RETURNING m.*
    $sql$, p_lane)
    USING p_now, p_limit, p_worker, p_lease, p_blocked, p_claim_token;
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._claim_lane(integer, timestamptz, integer, text, interval, text[], bigint) IS
'Citus only: claim up to p_limit due rows of one lane (one shard, SKIP LOCKED): processing under the lease, with the claim token of this claim (one nextval per lane: a volatile function cannot run per row of a distributed UPDATE).';

REVOKE ALL ON FUNCTION mailroom_internal._claim_lane(integer, timestamptz, integer, text, interval, text[], bigint) FROM public;

CREATE OR REPLACE FUNCTION mailroom_internal._claim_lane_capped(
    p_lane integer, p_now timestamptz, p_limit integer, p_worker text, p_lease interval, p_domains text[],
    p_rooms integer[], p_claim_token bigint
)
RETURNS SETOF mailroom.outbound_messages
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    -- _claim_lane under per-domain caps: only rows of the domains _lane_rooms gave room to
    -- (p_domains), at most p_rooms[i] of domain i, in due order. As _claim_limited_due on one
    -- node, the head (twice the limit) is locked SKIP LOCKED first and the rooms are applied
    -- to it; a domain absent from p_domains (not met by _lane_rooms, or no room) is not locked
    -- at all, so the holder of a domain's lock is the only claimer locking its queued rows.
    -- Only IMMUTABLE functions of columns (array_position): the statement runs on the shard.
    RETURN QUERY EXECUTE format($sql$
    UPDATE mailroom.outbound_messages AS m
    SET
        status = 'processing',
        claimed_by = $3,
        claim_token = $7,
        claimed_at = $1,
        lease_expires_at = $1 + $4,
        updated_at = $1
    WHERE
        m.lane = %1$s
        AND (m.id, m.created_at) IN (
            SELECT r.id, r.created_at
            FROM (
                SELECT
                    h.id,
                    h.created_at,
                    h.priority,
                    h.due_at,
                    h.rcpt_domain,
                    row_number() OVER (PARTITION BY h.rcpt_domain ORDER BY h.priority DESC, h.due_at, h.id) AS n
                FROM (
                    SELECT
                        d.id,
                        d.created_at,
                        d.priority,
                        coalesce(d.next_retry_at, '-infinity'::timestamptz) AS due_at,
                        d.rcpt_domain
                    FROM mailroom.outbound_messages AS d
                    WHERE
                        d.lane = %1$s
                        AND d.status = 'queued'
                        AND coalesce(d.next_retry_at, '-infinity'::timestamptz) <= $1
                        AND d.created_at <= $1
                        AND d.rcpt_domain = ANY($5)
                    ORDER BY d.priority DESC, coalesce(d.next_retry_at, '-infinity'::timestamptz), d.id
                    LIMIT 2 * $2 + 8
                    FOR UPDATE SKIP LOCKED
                ) AS h
            ) AS r
            WHERE r.n <= $6[array_position($5, r.rcpt_domain)]
            ORDER BY r.priority DESC, r.due_at, r.id
            LIMIT $2
        )
    RETURNING m.*
    $sql$, p_lane)
    USING p_now, p_limit, p_worker, p_lease, p_domains, p_rooms, p_claim_token;
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._claim_lane_capped(
    integer, timestamptz, integer, text, interval, text[], integer[], bigint
) IS
'Citus only: _claim_lane under per-domain caps: rows of p_domains only, at most p_rooms[i] of domain i (one shard, SKIP LOCKED).';

REVOKE ALL ON FUNCTION mailroom_internal._claim_lane_capped(
    integer, timestamptz, integer, text, interval, text[], integer[], bigint
) FROM public;

CREATE OR REPLACE FUNCTION mailroom_internal._governing_limit(p_domain text, p_patterns text[])
RETURNS integer
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- _domain_limit over a copy of domain_limits' patterns: the position in p_patterns of the
    -- most specific pattern matching p_domain, NULL if none
    SELECT q.i::integer
    FROM unnest(mailroom_internal._domain_patterns(p_domain)) WITH ORDINALITY AS p (pattern, o)
    INNER JOIN unnest(p_patterns) WITH ORDINALITY AS q (pattern, i) ON p.pattern = q.pattern
    ORDER BY p.o
    LIMIT 1;
$$;

COMMENT ON FUNCTION mailroom_internal._governing_limit(text, text[]) IS
'Citus only: the position in p_patterns (domain_limits'' patterns) of the one governing p_domain (as _domain_limit), NULL if none.';

CREATE OR REPLACE FUNCTION mailroom_internal._lane_rooms(p_now timestamptz, p_limit integer, p_blocked text[])
RETURNS TABLE (lanes integer[], domains text[], rooms integer[], in_flight_capped text[], minute_capped text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_minute timestamptz := date_trunc('minute', p_now);
    v_patterns text[];
    v_max_in_flight integer[];
    v_max_per_minute integer[];
    v_blocked text[] := coalesce(p_blocked, '{}');
    v_busy_domains text[] := '{}';
    v_busy_counts bigint[] := '{}';
    v_lanes integer[] := '{}';
    v_seen text[] := '{}';
    v_capped text[];
    v_locked integer[];
    v_ids_asked bigint[];
    v_ids bigint[];
    v_tokens bigint[];
    v_attempts integer[];
    v_stale timestamptz;
    v_room integer;
    v_row record;
BEGIN
    -- The claim's plan under per-domain caps (Citus), the rule of _domain_room per domain:
    -- 1. the limits (a copy of the small reference table) and the domains that can get nothing
    --    by this statement's snapshot (at the per-minute or in-flight cap; p_blocked: backed
    --    off), a hint that keeps their rows out of the head, as _blocked_domains on one node;
    -- 2. the head of the queue over every lane (each shard's first rows in due order, merged:
    --    the rows a claim of p_limit would look at), its lanes and domains;
    -- 3. the locks of its capped domains (domain_locks, SKIP LOCKED: a domain held by another
    --    claimer gets nothing); under them, in statements of their own (fresh snapshots), the
    --    claims of earlier holders the workers do not show yet (outbound_domain_claims,
    --    sql/citus/07), then the in-flight count over all lanes, and the minute's count: the room.
    -- Uncapped domains get p_limit. A domain not in the result gets nothing in this claim.
    SELECT array_agg(l.pattern), array_agg(l.max_in_flight), array_agg(l.max_per_minute)
    INTO v_patterns, v_max_in_flight, v_max_per_minute
    FROM mailroom.domain_limits AS l;
    v_patterns := coalesce(v_patterns, '{}');

    FOR v_row IN
        SELECT m.rcpt_domain AS domain, count(*) AS n
        FROM mailroom.outbound_messages AS m
        WHERE m.status = 'processing'
        GROUP BY m.rcpt_domain
    LOOP
        v_busy_domains := v_busy_domains || v_row.domain;
        v_busy_counts := v_busy_counts || v_row.n;
    END LOOP;
    v_blocked := v_blocked || ARRAY(
        SELECT b.domain
        FROM unnest(v_busy_domains, v_busy_counts) AS b (domain, n)
        CROSS JOIN LATERAL (SELECT mailroom_internal._governing_limit(b.domain, v_patterns) AS i) AS g
        WHERE b.n >= v_max_in_flight[g.i]
    ) || ARRAY(
        SELECT s.domain
        FROM mailroom.domain_state AS s
        CROSS JOIN LATERAL (SELECT mailroom_internal._governing_limit(s.domain, v_patterns) AS i) AS g
        WHERE s.window_start = v_minute AND s.window_count >= v_max_per_minute[g.i]
    );

    FOR v_row IN
        SELECT d.lane, d.rcpt_domain
        FROM mailroom.outbound_messages AS d
        WHERE
            d.status = 'queued'
            AND coalesce(d.next_retry_at, '-infinity'::timestamptz) <= p_now
            AND d.created_at <= p_now
            AND d.rcpt_domain <> ALL (v_blocked)
        ORDER BY d.priority DESC, coalesce(d.next_retry_at, '-infinity'::timestamptz), d.id
        LIMIT 2 * p_limit + 8
    LOOP
        IF v_row.lane <> ALL (v_lanes) THEN
            v_lanes := v_lanes || v_row.lane;
        END IF;
        IF v_row.rcpt_domain <> ALL (v_seen) THEN
            v_seen := v_seen || v_row.rcpt_domain;
        END IF;
    END LOOP;

    -- the capped domains met, in domain order, and the locks this claim got
    v_capped := ARRAY(
        SELECT s.domain
        FROM unnest(v_seen) AS s (domain)
        CROSS JOIN LATERAL (SELECT mailroom_internal._governing_limit(s.domain, v_patterns) AS i) AS g
        WHERE v_max_in_flight[g.i] IS NOT NULL OR v_max_per_minute[g.i] IS NOT NULL
        ORDER BY s.domain
    );
    IF cardinality(v_capped) > 0 THEN
        v_locked := ARRAY(
            SELECT k.bucket
            FROM mailroom.domain_locks AS k
            WHERE k.bucket = ANY (ARRAY(
                SELECT (pg_catalog.hashtextextended(c.domain, 0) & 1023)::integer FROM unnest(v_capped) AS c (domain)
            ))
            ORDER BY k.bucket
            FOR UPDATE SKIP LOCKED
        );
        v_capped := ARRAY(
            SELECT c.domain FROM unnest(v_capped) AS c (domain)
            WHERE (pg_catalog.hashtextextended(c.domain, 0) & 1023)::integer = ANY (v_locked)
            ORDER BY c.domain
        );
    END IF;

    -- under the locks, first the earlier holders' claims: resolved once a worker shows the row
    -- claimed by that token or a later one, or gone; until then (their second phase is under
    -- way) in flight. Resolved before the workers' in-flight count, never after: a second phase
    -- landing between the two statements is then counted twice (a slot idle for a claim), where
    -- the other order counted it by neither (a claim past the cap)
    v_busy_domains := '{}';
    v_busy_counts := '{}';
    IF cardinality(v_capped) > 0 THEN
        v_ids_asked := ARRAY(
            SELECT c.message_id FROM mailroom.outbound_domain_claims AS c WHERE c.domain = ANY (v_capped)
        );
        IF cardinality(v_ids_asked) > 0 THEN
            v_ids := '{}';
            v_tokens := '{}';
            v_attempts := '{}';
            -- the rows still as they were before a claim: queued (a claim takes queued rows only)
            FOR v_row IN
                SELECT m.id, m.claim_token, m.attempts
                FROM mailroom.outbound_messages AS m
                WHERE
                    m.id = ANY (v_ids_asked)
                    AND m.status = 'queued'
            LOOP
                v_ids := v_ids || v_row.id;
                v_tokens := v_tokens || coalesce(v_row.claim_token, -1);
                v_attempts := v_attempts || v_row.attempts;
            END LOOP;
            -- (a variable: Citus refuses a VOLATILE function in a write's WHERE)
            v_stale := clock_timestamp() - interval '10 seconds';
            DELETE FROM mailroom.outbound_domain_claims AS c
            WHERE
                c.domain = ANY (v_capped)
                AND (
                    c.recorded_at < v_stale
                    OR NOT EXISTS (
                        SELECT 1 FROM unnest(v_ids, v_tokens, v_attempts) AS w (id, token, attempts)
                        WHERE w.id = c.message_id AND w.token < c.claim_token AND w.attempts = c.attempts
                    )
                );
        END IF;
        -- then what is in flight now, counted by the workers
        FOR v_row IN
            SELECT m.rcpt_domain AS domain, count(*) AS n
            FROM mailroom.outbound_messages AS m
            WHERE m.status = 'processing' AND m.rcpt_domain = ANY (v_capped)
            GROUP BY m.rcpt_domain
        LOOP
            v_busy_domains := v_busy_domains || v_row.domain;
            v_busy_counts := v_busy_counts || v_row.n;
        END LOOP;
    END IF;

    lanes := ARRAY(SELECT x.lane FROM unnest(v_lanes) AS x (lane) ORDER BY random());
    in_flight_capped := '{}';
    minute_capped := '{}';
    domains := '{}';
    rooms := '{}';
    FOR v_row IN
        SELECT
            s.domain,
            v_max_in_flight[g.i] AS max_in_flight,
            v_max_per_minute[g.i] AS max_per_minute,
            s.domain = ANY (v_capped) AS locked
        FROM unnest(v_seen) AS s (domain)
        LEFT JOIN LATERAL (SELECT mailroom_internal._governing_limit(s.domain, v_patterns) AS i) AS g ON TRUE
    LOOP
        IF v_row.max_in_flight IS NULL AND v_row.max_per_minute IS NULL THEN
            domains := domains || v_row.domain;
            rooms := rooms || p_limit;
            CONTINUE;
        END IF;
        CONTINUE WHEN NOT v_row.locked;
        IF v_row.max_in_flight IS NOT NULL THEN
            in_flight_capped := in_flight_capped || v_row.domain;
        END IF;
        IF v_row.max_per_minute IS NOT NULL THEN
            minute_capped := minute_capped || v_row.domain;
        END IF;
        v_room := least(
            coalesce(v_row.max_in_flight - coalesce(v_busy_counts[array_position(v_busy_domains, v_row.domain)], 0)
                - (SELECT count(*) FROM mailroom.outbound_domain_claims AS c WHERE c.domain = v_row.domain)::integer,
                2147483647),
            coalesce(v_row.max_per_minute - coalesce((
                SELECT s.window_count FROM mailroom.domain_state AS s
                WHERE s.domain = v_row.domain AND s.window_start = v_minute
            ), 0), 2147483647)
        );
        IF v_room > 0 THEN
            domains := domains || v_row.domain;
            rooms := rooms || v_room;
        END IF;
    END LOOP;
    RETURN NEXT;
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._lane_rooms(timestamptz, integer, text[]) IS
'Citus only: a capped claim''s plan: the lanes of the queue''s head, its domains and the room of each (capped ones under their per-domain lock, counted across lanes), the capped domains to record.';

REVOKE ALL ON FUNCTION mailroom_internal._lane_rooms(timestamptz, integer, text[]) FROM public;

CREATE OR REPLACE FUNCTION mailroom_internal._due_lanes(p_now timestamptz, p_limit integer, p_blocked text[])
RETURNS TABLE (lanes integer[], nodes integer[])
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
-- claim_messages plans generically (sql/33); Citus has no generic plan for a multi-shard read
-- with parameters ("could not create distributed plan")
SET plan_cache_mode = force_custom_plan
AS $fn$
DECLARE
    v_head integer[];
    v_all integer[];
    v_lane integer;
BEGIN
    -- The lanes an uncapped claim visits, and the node (Citus group) of each. First the head of
    -- the queue over every lane: each shard's first due rows in the claim's order (its index,
    -- outbound_messages_due_idx), merged here. A read without locks opens no transaction on the
    -- workers, so a claim with nothing due costs this one read, not a locking statement on
    -- every lane and a two-phase commit of both workers (issue 37).
    -- Each lane once, in the order of its first row: read by a loop over the statement itself (as
    -- ARRAY(SELECT …) the ordered read became an intermediate result and a second statement on the
    -- coordinator to read it back, issue 46).
    v_head := '{}';
    FOR v_lane IN
        SELECT d.lane
        FROM mailroom.outbound_messages AS d
        WHERE
            d.status = 'queued'
            AND coalesce(d.next_retry_at, '-infinity'::timestamptz) <= p_now
            AND d.created_at <= p_now
            AND d.rcpt_domain <> ALL (coalesce(p_blocked, '{}'))
        ORDER BY d.priority DESC, coalesce(d.next_retry_at, '-infinity'::timestamptz), d.id
        LIMIT p_limit
    LOOP
        IF v_lane <> ALL (v_head) THEN
            v_head := v_head || v_lane;
        END IF;
    END LOOP;
    IF cardinality(v_head) = 0 THEN
        lanes := '{}';
        nodes := '{}';
        RETURN NEXT;
        RETURN;
    END IF;
    -- (the reference table in a statement of its own: the one below reads Citus' catalog)
    v_all := ARRAY(SELECT l.lane FROM mailroom.outbound_lanes AS l);
    -- The head's lanes on the node of its first row (the most urgent), in head order; then
    -- the head's lanes on the other nodes; then every other lane, for when the head's rows were
    -- all taken by concurrent claimers (SKIP LOCKED) while more are due.
    WITH placed AS (
        SELECT
            a.lane,
            (
                SELECT min(pl.groupid) FROM pg_catalog.pg_dist_placement AS pl
                WHERE pl.shardid = get_shard_id_for_distribution_column('mailroom.outbound_messages', a.lane)
            ) AS node,
            (SELECT min(h.o) FROM unnest(v_head) WITH ORDINALITY AS h (lane, o) WHERE h.lane = a.lane) AS o
        FROM unnest(v_all) AS a (lane)
    ),

    first AS (
        SELECT p.node FROM placed AS p WHERE p.lane = v_head[1]
    )

    SELECT
        array_agg(p.lane ORDER BY p.o IS NULL, p.node IS DISTINCT FROM f.node, p.node, p.o, p.lane),
        array_agg(p.node ORDER BY p.o IS NULL, p.node IS DISTINCT FROM f.node, p.node, p.o, p.lane)
    INTO lanes, nodes
    FROM placed AS p
    CROSS JOIN first AS f;
    RETURN NEXT;
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._due_lanes(timestamptz, integer, text[]) IS
'Citus only: an uncapped claim''s lanes and the node of each: the queue head''s lanes (one read without locks), the first row''s node first; none when nothing is due.';

REVOKE ALL ON FUNCTION mailroom_internal._due_lanes(timestamptz, integer, text[]) FROM public;

-- One connection a worker for the head's read, its shards read one after the other on it: the
-- executor otherwise opens more connections to a worker while tasks wait (slow start, 10 ms),
-- and a session keeps one a worker (citus.max_cached_conns_per_worker), so each claim paid new
-- ones (a backend started on the worker each), more than the few small reads they run side by
-- side. (Through EXECUTE: sqlfluff cannot parse a SET of a dotted setting.)
DO $pool$
BEGIN
    EXECUTE 'ALTER FUNCTION mailroom_internal._due_lanes(timestamptz, integer, text[]) '
        'SET citus.max_adaptive_executor_pool_size = 1';
END;
$pool$;

CREATE OR REPLACE FUNCTION mailroom_internal._claim(
    p_now timestamptz, p_limit integer, p_worker text, p_lease interval, p_limited boolean
)
RETURNS SETOF mailroom.claimed_message
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- claim_messages' planner settings (sql/33) make the reading statement's plan cost about 1e10 (a
-- disabled node), far above jit_above_cost: each claim then JIT-compiled it with inlining, 9-14 s
-- for a batch of 100 on the coordinator (auto_explain). The statement is a few index probes.
SET jit = off
AS $fn$
#variable_conflict use_column
DECLARE
    v_blocked text[] := '{}';
    v_capped boolean := false;
    v_domains text[];
    v_rooms integer[];
    v_in_flight_capped text[];
    v_minute_capped text[];
    v_lanes integer[];
    v_nodes integer[];
    v_head integer[];
    v_lane integer;
    v_i integer;
    v_left integer := p_limit;
    v_got integer;
    v_rows mailroom.outbound_messages[];
    v_taken_domains text[] := '{}';
    v_taken_ids bigint[] := '{}';
    v_taken_tokens bigint[] := '{}';
    v_taken_attempts integer[] := '{}';
    v_domain text;
    v_count integer;
    v_token_id bigint;
    v_token_ids bigint[];
    v_token_subjects text[];
    v_token_texts text[];
    v_token_htmls text[];
    v_subject text;
    v_text text;
    v_html text;
    v_path_row record;
    v_k integer;
    v_paths jsonb;
    v_bounce_senders bigint[] := '{}';
    v_bounce_domains text[] := '{}';
    v_verp_key bytea;
BEGIN
    IF p_limited THEN
        v_blocked := ARRAY(SELECT s.domain FROM mailroom.domain_state AS s WHERE s.backoff_until > p_now);
        v_capped := EXISTS (
            SELECT 1 FROM mailroom.domain_limits AS l
            WHERE l.max_in_flight IS NOT NULL OR l.max_per_minute IS NOT NULL
        );
    END IF;
    IF v_capped THEN
        -- per-domain caps: the lanes and the room of each domain decided first, on the coordinator
        SELECT r.lanes, r.domains, r.rooms, r.in_flight_capped, r.minute_capped
        INTO v_lanes, v_domains, v_rooms, v_in_flight_capped, v_minute_capped
        FROM mailroom_internal._lane_rooms(p_now, p_limit, v_blocked) AS r;
    ELSIF current_setting('mailroom.claim_found_none', true) = 'on' THEN
        -- the session's last claim found nothing due: the head's read first (a read without row
        -- locks), so an idle sender's every poll is that read alone, not a lane's locking UPDATE on a
        -- worker before it (issue 46)
        v_lanes := '{}';
    ELSE
        -- a random lane first: with a queue deeper than the claim, that one statement fills it
        v_lanes := ARRAY(SELECT l.lane FROM mailroom.outbound_lanes AS l ORDER BY random() LIMIT 1);
    END IF;
    v_i := 0;
    LOOP
        v_i := v_i + 1;
        IF v_i > coalesce(cardinality(v_lanes), 0) THEN
            -- the first lane did not fill an uncapped claim: the lanes of the queue's head, the
            -- first row's worker first (one read without locks: nothing due, nothing more)
            EXIT WHEN v_capped OR v_nodes IS NOT NULL OR v_left <= 0;
            SELECT d.lanes, d.nodes INTO v_head, v_nodes
            FROM mailroom_internal._due_lanes(p_now, p_limit, v_blocked) AS d;
            v_lanes := v_lanes || ARRAY(
                SELECT x.lane FROM unnest(v_head) WITH ORDINALITY AS x (lane, o)
                WHERE x.lane <> ALL (v_lanes)
                ORDER BY x.o
            );
            EXIT WHEN v_i > cardinality(v_lanes);
        END IF;
        v_lane := v_lanes[v_i];
        EXIT WHEN v_left <= 0;
        -- Claim first, into a variable, then read what goes with the rows in a statement of its
        -- own: one statement naming both _claim_lane and a reference table is shipped by Citus to
        -- a node as a whole (the claim then runs nested, in another backend), which cost ~0.5 s
        -- a lane even when nothing was due (docs/scale.md).
        IF v_capped THEN
            EXIT WHEN cardinality(v_domains) = 0;
            v_rows := ARRAY(
                SELECT c
                FROM mailroom_internal._claim_lane_capped(
                    v_lane, p_now, v_left, p_worker, p_lease, v_domains, v_rooms,
                    mailroom_internal._lane_claim_token(v_lane)
                ) AS c
            );
            CONTINUE WHEN cardinality(v_rows) = 0;
            -- the room spent in this lane; a domain without room left is met no more
            SELECT array_agg(r.domain ORDER BY r.o), array_agg(r.room ORDER BY r.o)
            INTO v_domains, v_rooms
            FROM (
                SELECT p.domain, p.o, p.room - (SELECT count(*) FROM unnest(v_rows) AS c WHERE c.rcpt_domain = p.domain)::integer AS room
                FROM unnest(v_domains, v_rooms) WITH ORDINALITY AS p (domain, room, o)
            ) AS r
            WHERE r.room > 0;
            v_domains := coalesce(v_domains, '{}');
            v_rooms := coalesce(v_rooms, '{}');
            SELECT
                v_taken_domains || coalesce(array_agg(c.rcpt_domain), '{}'),
                v_taken_ids || coalesce(array_agg(c.id), '{}'),
                v_taken_tokens || coalesce(array_agg(c.claim_token), '{}'),
                v_taken_attempts || coalesce(array_agg(c.attempts), '{}')
            INTO v_taken_domains, v_taken_ids, v_taken_tokens, v_taken_attempts
            FROM unnest(v_rows) AS c
            WHERE c.rcpt_domain = ANY (v_in_flight_capped) OR c.rcpt_domain = ANY (v_minute_capped);
        ELSE
            v_rows := ARRAY(
                SELECT c
                FROM mailroom_internal._claim_lane(
                    v_lane, p_now, v_left, p_worker, p_lease, v_blocked, mailroom_internal._lane_claim_token(v_lane)
                ) AS c
            );
        END IF;
        CONTINUE WHEN cardinality(v_rows) = 0;
        -- token emails rendered (a fresh link minted) one token per statement of its own, on the
        -- coordinator: _mint_token reads and writes the distributed tokens and accounts, which
        -- a statement naming reference tables (the one below) cannot do once Citus ships it to
        -- a node whole ("could not create distributed plan"); a statement naming no table runs
        -- here, and each of _mint_token's statements is routed to the token's shard
        v_token_ids := '{}';
        v_token_subjects := '{}';
        v_token_texts := '{}';
        v_token_htmls := '{}';
        FOR v_token_id IN
            SELECT c.token_id FROM unnest(v_rows) AS c WHERE c.token_id IS NOT NULL ORDER BY c.id
        LOOP
            SELECT e.subject, e.text_body, e.html_body
            INTO v_subject, v_text, v_html
            FROM mailroom_internal._claim_token_email(v_token_id) AS e;
            -- no row: the token is gone (purged), rendered as on one node (subject kept, no body)
            CONTINUE WHEN NOT FOUND;
            v_token_ids := v_token_ids || v_token_id;
            v_token_subjects := v_token_subjects || v_subject;
            v_token_texts := v_token_texts || v_text;
            v_token_htmls := v_token_htmls || v_html;
        END LOOP;
        -- the rows' return paths (VERP, sql/36), made here: each sender's bounce domain and the VERP
        -- key read once a claim, where _return_paths in the statement below read them for every row,
        -- twice (each read of a reference table is a statement of its own on the coordinator, ~0.15
        -- ms: a third of a claim of 10, issue 46); the key stays out of every statement's text
        v_paths := '{}';
        FOR v_path_row IN
            SELECT c.id, c.sender_id, cardinality(mailroom_internal._envelope(c.to_addrs, c.cc_addrs, c.bcc_addrs)) AS n
            FROM unnest(v_rows) AS c
        LOOP
            v_k := array_position(v_bounce_senders, v_path_row.sender_id);
            IF v_k IS NULL THEN
                v_bounce_senders := v_bounce_senders || v_path_row.sender_id;
                v_bounce_domains := v_bounce_domains || mailroom_internal._message_bounce_domain(v_path_row.sender_id);
                v_k := cardinality(v_bounce_senders);
            END IF;
            IF v_bounce_domains[v_k] IS NOT NULL AND v_verp_key IS NULL THEN
                SELECT k.key INTO v_verp_key FROM mailroom.verp_key AS k WHERE k.singleton;
            END IF;
            v_paths := v_paths || jsonb_build_object(
                v_path_row.id::text,
                mailroom_internal._verp_paths(v_path_row.id, v_path_row.n, v_bounce_domains[v_k], v_verp_key)
            );
        END LOOP;
        RETURN QUERY
        SELECT
            c.id,
            c.claim_token,
            c.attempts,
            c.message_id,
            r.name,
            r.from_address,
            -- erased recipients (in place, sql/07) skipped as on one node (sql/33)
            mailroom_internal._unerased(c.to_addrs, c.to_addrs),
            mailroom_internal._unerased(c.cc_addrs, c.cc_addrs),
            mailroom_internal._unerased(c.bcc_addrs, c.bcc_addrs),
            coalesce(t.subject, c.subject),
            CASE WHEN c.token_id IS NULL THEN c.text_body ELSE t.text_body END,
            CASE WHEN c.token_id IS NULL THEN c.html_body ELSE t.html_body END,
            c.headers,
            c.created_at,
            c.possibly_sent,
            r.smtp_host,
            r.smtp_port,
            r.smtp_security,
            r.smtp_username,
            r.smtp_password_sealed,
            r.smtp_password_sealed IS NOT NULL OR r.smtp_password_encrypted IS NOT NULL,
            r.smtp_allow_cleartext,
            CASE WHEN cardinality(e.live) = 1 THEN p.paths[1] END,
            e.live,
            p.paths,
            CASE
                WHEN c.bulk THEN mailroom_internal._unerased(
                    mailroom_internal._list_unsubscribe(c.id, c.sender_id, cardinality(e.envelope)), e.envelope
                )
            END,
            k.domain,
            k.selector,
            k.public_key,
            k.algorithm,
            mailroom_internal._attachments_json(c.attachments),
            c.raw_message,
            -- a webhook delivery (sql/38_outbound_webhooks.sql), as on one node (sql/33)
            c.kind,
            w.url,
            w.secret_sealed
        FROM unnest(v_rows) AS c
        LEFT JOIN mailroom.senders AS r ON c.sender_id = r.id
        LEFT JOIN mailroom.webhook_endpoints AS w ON c.kind = 'webhook' AND c.webhook_endpoint_id = w.id
            -- an endpoint of a revoked API key is as one removed: its queued deliveries fail ('local')
            AND NOT EXISTS (SELECT FROM mailroom.api_keys AS ak WHERE ak.id = w.key_id AND ak.revoked_at IS NOT NULL)
        CROSS JOIN LATERAL (
            SELECT x.envelope, mailroom_internal._unerased(x.envelope, x.envelope) AS live
            FROM (SELECT mailroom_internal._envelope(c.to_addrs, c.cc_addrs, c.bcc_addrs) AS envelope) AS x
        ) AS e
        CROSS JOIN LATERAL (
            SELECT mailroom_internal._unerased(
                CASE
                    WHEN jsonb_typeof(v_paths -> c.id::text) = 'array'
                        THEN ARRAY(SELECT jsonb_array_elements_text(v_paths -> c.id::text))
                END,
                e.envelope
            ) AS paths
        ) AS p
        LEFT JOIN mailroom.dkim_keys AS k ON k.domain = mailroom_internal._address_domain(r.from_address)
        LEFT JOIN unnest(v_token_ids, v_token_subjects, v_token_texts, v_token_htmls)
            AS t (token_id, subject, text_body, html_body) ON c.token_id = t.token_id
        -- a lane's rows by priority, then due order (sql/33; lanes are visited in turn)
        ORDER BY c.priority DESC, coalesce(c.next_retry_at, '-infinity'::timestamptz), c.id;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END LOOP;
    IF NOT v_capped THEN
        -- for the session's next claim (above): a session setting, so a pooler's other session
        -- only starts with the other order, never claims differently
        PERFORM pg_catalog.set_config(
            'mailroom.claim_found_none', CASE WHEN v_left = p_limit THEN 'on' ELSE 'off' END, false
        );
    END IF;
    IF v_capped AND cardinality(v_taken_ids) > 0 THEN
        -- while the locks are held, on the coordinator (sql/citus/07): the rows of in-flight
        -- capped domains, for the next holder to count until the workers show them claimed
        INSERT INTO mailroom.outbound_domain_claims (domain, message_id, claim_token, attempts)
        SELECT t.domain, t.id, t.token, t.attempts
        FROM unnest(v_taken_domains, v_taken_ids, v_taken_tokens, v_taken_attempts) AS t (domain, id, token, attempts)
        WHERE t.domain = ANY (v_in_flight_capped)
        ON CONFLICT DO NOTHING;
        -- the claims of per-minute capped domains, counted in the current minute, in domain
        -- order (finalize's order too); one row per statement, as _note_domain_outcomes
        FOR v_domain, v_count IN
            SELECT t.domain, count(*)::integer
            FROM unnest(v_taken_domains) AS t (domain)
            WHERE t.domain = ANY (v_minute_capped)
            GROUP BY t.domain
            ORDER BY t.domain
        LOOP
            INSERT INTO mailroom.domain_state AS s (domain, window_start, window_count, updated_at)
            VALUES (v_domain, date_trunc('minute', p_now), v_count, p_now)
            ON CONFLICT (domain) DO UPDATE
            SET
                window_count = CASE
                    WHEN s.window_start = excluded.window_start THEN s.window_count + excluded.window_count
                    ELSE excluded.window_count
                END,
                window_start = excluded.window_start,
                updated_at = excluded.updated_at;
        END LOOP;
    END IF;
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._claim(timestamptz, integer, text, interval, boolean) IS
'Internal (Citus): the claim, lane by lane from a random one (_claim_lane: one shard, SKIP LOCKED), or from the queue head''s lanes when the session''s last claim found nothing (mailroom.claim_found_none), with the relay settings and rendered token emails of sql/33; under per-domain caps with the rooms of _lane_rooms.';

-- sql/34's seam: a statement that locks with SKIP LOCKED (reap_stuck_messages) runs once a lane,
-- the lane written into its text so it routes to one shard
CREATE OR REPLACE FUNCTION mailroom_internal._outbound_scopes()
RETURNS SETOF text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('m.lane = %s', l.lane) FROM mailroom.outbound_lanes AS l ORDER BY random()
$$;

COMMENT ON FUNCTION mailroom_internal._outbound_scopes() IS
'Internal (Citus): one condition a lane of outbound_messages AS m (m.lane = n), in random order.';

CREATE OR REPLACE FUNCTION mailroom_internal._queue_verb_change(
    p_verb text,
    p_where text,
    p_positions text,
    p_set text,
    p_ids bigint[],
    p_domain text,
    p_from text[],
    p_include boolean,
    p_now timestamptz
)
RETURNS TABLE (changed bigint, ids bigint[], domains text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_lane integer;
    v_ids bigint[] := '{}';
    v_domains text[] := '{}';
    v_keys_scope text[] := '{}';
    v_keys_key text[] := '{}';
    v_got_ids bigint[];
    v_got_domains text[];
    v_got_scopes text[];
    v_got_keys text[];
BEGIN
    -- The operator verbs' change, lane by lane: SKIP LOCKED runs only in a single-shard
    -- statement (the lane written into the text, as in _claim_lane); a deleted message's
    -- idempotency key (a coordinator table) goes in a statement of its own. The selection's
    -- alias m becomes d inside (a word-start match: mailroom. stays).
    FOR v_lane IN SELECT l.lane FROM mailroom.outbound_lanes AS l ORDER BY l.lane LOOP
        IF p_verb = 'delete' THEN
            EXECUTE format(
                'WITH gone AS (DELETE FROM mailroom.outbound_messages AS m WHERE m.lane = %2$s '
                'AND (m.id, m.created_at) IN (SELECT d.id, d.created_at FROM mailroom.outbound_messages AS d '
                'WHERE d.lane = %2$s AND %1$s AND d.status = ANY ($3::mailroom.outbound_status[]) FOR UPDATE SKIP LOCKED) '
                'RETURNING m.id, m.rcpt_domain, m.idempotency_scope, m.idempotency_key) '
                'SELECT array_agg(g.id), array_agg(g.rcpt_domain), array_agg(g.idempotency_scope), '
                'array_agg(g.idempotency_key) FROM gone AS g',
                regexp_replace(p_where, '\mm\.', 'd.', 'g'), v_lane
            ) INTO v_got_ids, v_got_domains, v_got_scopes, v_got_keys
            USING p_ids, p_domain, p_from, p_include, p_now;
            v_keys_scope := v_keys_scope || coalesce(v_got_scopes, '{}');
            v_keys_key := v_keys_key || coalesce(v_got_keys, '{}');
        ELSE
            EXECUTE format(
                'WITH done AS (UPDATE mailroom.outbound_messages AS m SET %3$s, updated_at = $5 WHERE m.lane = %4$s '
                'AND (m.id, m.created_at) IN (SELECT d.id, d.created_at FROM mailroom.outbound_messages AS d '
                'WHERE d.lane = %4$s AND %1$s AND d.status = ANY ($3::mailroom.outbound_status[]) '
                'AND ($4 OR cardinality(%2$s) = 0) FOR UPDATE SKIP LOCKED) '
                'RETURNING m.id, m.rcpt_domain) '
                'SELECT array_agg(x.id), array_agg(x.rcpt_domain) FROM done AS x',
                regexp_replace(p_where, '\mm\.', 'd.', 'g'), regexp_replace(p_positions, '\mm\.', 'd.', 'g'), p_set, v_lane
            ) INTO v_got_ids, v_got_domains
            USING p_ids, p_domain, p_from, p_include, p_now;
        END IF;
        v_ids := v_ids || coalesce(v_got_ids, '{}');
        v_domains := v_domains || coalesce(v_got_domains, '{}');
    END LOOP;
    IF cardinality(v_keys_key) > 0 THEN
        DELETE FROM mailroom.outbound_idempotency_keys AS k
        USING unnest(v_keys_scope, v_keys_key) AS g (scope, key)
        WHERE k.scope = g.scope AND k.key = g.key AND k.message_id = ANY(v_ids);
    END IF;
    changed := cardinality(v_ids);
    ids := ARRAY(SELECT u.id FROM unnest(v_ids) AS u (id) ORDER BY u.id LIMIT 20);
    domains := ARRAY(SELECT DISTINCT u.d FROM unnest(v_domains) AS u (d) WHERE u.d IS NOT NULL);
    RETURN NEXT;
END;
$fn$;

COMMENT ON FUNCTION mailroom_internal._queue_verb_change(text, text, text, text, bigint[], text, text[], boolean, timestamptz) IS
'Internal (Citus): _queue_verb''s change lane by lane (single-shard SKIP LOCKED); deleted messages'' idempotency keys in a statement of their own.';

-- retry's test of the suppression list runs in statements Citus pushes to the shards, where it
-- reads suppressions (a reference table: a replica on every node) from inside a function: a
-- "nested distributed execution", refused by default because a nested query may not see the
-- outer transaction's writes. Suppressions are never written by the statements that test them,
-- so the nested read is exact here; the permission is given to this function only.
-- (through EXECUTE: sqlfluff cannot parse a SET of a dotted setting in ALTER FUNCTION)
DO $nested$
BEGIN
    EXECUTE 'ALTER FUNCTION mailroom_internal._suppressed_recipients(text[], text[], text[]) '
        'SET citus.allow_nested_distributed_execution = on';
END;
$nested$;

-- finalize_messages and release_messages (sql/34) update by id, which is not the distribution
-- column, and name the lanes their claim tokens carry (_claim_lanes, sql/citus/05): the shards of
-- those lanes only, all of them for a token without a lane. One connection a worker (see
-- _due_lanes): without it the executor opened up to 6 connections to the two workers for the 8
-- shards, each then prepared and committed in two phases (issue 37). Planned with their values at
-- every call: the lanes are then a constant Citus prunes the shards by (a generic plan's parameter
-- is not).
DO $finalize$
BEGIN
    EXECUTE 'ALTER FUNCTION mailroom.finalize_messages(bigint[], bigint[], text[], integer[], text[], text[]) '
        'SET citus.max_adaptive_executor_pool_size = 1';
END;
$finalize$;
ALTER FUNCTION mailroom.finalize_messages(bigint[], bigint[], text[], integer[], text[], text[])
SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION mailroom.release_messages(bigint[], bigint[]) SET plan_cache_mode = force_custom_plan;

-- A token email's rendering (_claim_token_email, sql/41) runs inside claim_messages, which plans a
-- small unlimited claim generically (plan_cache_mode = force_generic_plan, sql/33). _mint_token's
-- first read finds the token by id (not the distribution column: a multi-shard read) with the id as
-- a parameter, and Citus has no generic plan for that ("could not create distributed plan"): the
-- rendering is planned per call here, as every routed statement is on Citus anyway.
ALTER FUNCTION mailroom_internal._claim_token_email(bigint) SET plan_cache_mode = force_custom_plan;
