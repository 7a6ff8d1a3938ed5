-- The operator's verbs on the outbound queue (issue 23; docs/operations.md): hold, release, cancel,
-- delete, run now and retry, and the queue by recipient domain (`mailroom outbound queue`, what
-- Postfix's mailq shows). Each verb is one SQL function an admin calls from psql, the same call the
-- CLI makes:
--
--   SELECT * FROM mailroom.hold_messages(p_domain => 'example.com');
--   SELECT * FROM mailroom.cancel_messages(ARRAY[42, 43], p_dry_run => true);
--   SELECT * FROM mailroom.retry_messages(p_all => true, p_status => 'failed');
--
-- A verb names its messages one way: ids, a recipient domain, or all (p_all); p_status narrows
-- them to one status; p_dry_run says what the call would do and changes nothing. A message being
-- delivered (processing) is never touched: it is counted as in flight. One message named alone
-- that the verb cannot change is an error that says why (MR340 unknown, MR341 its status, MR318 a
-- recipient now suppressed). Every change is a line in the message's error_log. Each verb returns
-- one row: changed (or would change), in_flight, suppressed (retry: messages with a recipient now
-- on the suppression list), the first 20 ids changed and the first 20 ids with a suppressed
-- recipient. Error code of its own: MR344 a bad selection.
--
-- The verbs are data: a row of mailroom.queue_verbs each (migration 0251), read here (the statuses a
-- verb changes, what it sets, its log line, whether it wakes the senders), by the CLI and by the
-- docs; each verb keeps its own public function below and its own grant. The statuses 'held' and
-- 'cancelled' are named only in PL/pgSQL bodies and data (migration 0160).

CREATE OR REPLACE FUNCTION mailroom_internal._queue_verb_statuses(p_verb text)
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the statuses a verb changes a message from (its row of queue_verbs; NULL: no such verb)
    RETURN (SELECT v.from_statuses FROM mailroom.queue_verbs AS v WHERE v.verb = p_verb);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._queue_verb_statuses(text) IS
'Internal: the statuses an operator verb (a row of mailroom.queue_verbs) changes a message from.';

CREATE OR REPLACE FUNCTION mailroom_internal._operator_log(p_log text, p_now timestamptz, p_what text, p_max integer)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- error_log with one more line: what an operator did, when (the last p_max characters kept).
    -- IMMUTABLE, the limit an argument: Citus calls it per row of a distributed UPDATE.
    SELECT right(
        concat_ws(E'\n', p_log, to_char(p_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ' ' || p_what),
        p_max
    )
$$;

COMMENT ON FUNCTION mailroom_internal._operator_log(text, timestamptz, text, integer) IS
'Internal: error_log with a line for an operator''s action (UTC time, what), trimmed to its last p_max characters.';

-- Its Citus form: sql/citus/20_queue.sql replaces this whole body (mailroom.db.citus.WHOLE_OVERRIDES).
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
AS $$
#variable_conflict use_column
BEGIN
    -- _queue_verb's change: the selected rows no one else holds (SKIP LOCKED), deleted or set by
    -- p_set; $1..$5 of p_where/p_set are the ids, domain, statuses, include-suppressed and now.
    -- One statement on one node; sql/citus/20 runs it lane by lane.
    IF (SELECT v.deletes FROM mailroom.queue_verbs AS v WHERE v.verb = p_verb) THEN
        EXECUTE format(
            'WITH sel AS (SELECT m.id, m.created_at FROM mailroom.outbound_messages AS m '
            'WHERE %s AND m.status = ANY ($3::mailroom.outbound_status[]) FOR UPDATE SKIP LOCKED), '
            'gone AS (DELETE FROM mailroom.outbound_messages AS m USING sel '
            'WHERE m.id = sel.id AND m.created_at = sel.created_at '
            'RETURNING m.id, m.rcpt_domain, m.idempotency_scope, m.idempotency_key), '
            'keys AS (DELETE FROM mailroom.outbound_idempotency_keys AS k USING gone AS g '
            'WHERE k.scope = g.idempotency_scope AND k.key = g.idempotency_key AND k.message_id = g.id) '
            'SELECT count(*), (array_agg(g.id ORDER BY g.id))[1:20], array_agg(DISTINCT g.rcpt_domain) FROM gone AS g',
            p_where
        ) INTO changed, ids, domains USING p_ids, p_domain, p_from, p_include, p_now;
    ELSE
        EXECUTE format(
            'WITH sel AS (SELECT m.id, m.created_at FROM mailroom.outbound_messages AS m '
            'WHERE %s AND m.status = ANY ($3::mailroom.outbound_status[]) '
            'AND ($4 OR cardinality(%s) = 0) FOR UPDATE SKIP LOCKED), '
            'done AS (UPDATE mailroom.outbound_messages AS m SET %s, updated_at = $5 FROM sel '
            'WHERE m.id = sel.id AND m.created_at = sel.created_at RETURNING m.id, m.rcpt_domain) '
            'SELECT count(*), (array_agg(d.id ORDER BY d.id))[1:20], array_agg(DISTINCT d.rcpt_domain) FROM done AS d',
            p_where, p_positions, p_set
        ) INTO changed, ids, domains USING p_ids, p_domain, p_from, p_include, p_now;
    END IF;

    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._queue_verb_change(text, text, text, text, bigint[], text, text[], boolean, timestamptz) IS
'Internal: the change step of _queue_verb (delete, or UPDATE … SET p_set) on the rows p_where selects that no one else holds; returns how many, the first 20 ids and their recipient domains.';

CREATE OR REPLACE FUNCTION mailroom_internal._queue_verb(
    p_verb text,
    p_ids bigint[],
    p_domain text,
    p_all boolean,
    p_status text,
    p_dry_run boolean,
    p_include_suppressed boolean DEFAULT false
)
RETURNS TABLE (changed bigint, in_flight bigint, suppressed bigint, sample_ids bigint[], suppressed_ids bigint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := mailroom.clock();
    v_verb mailroom.queue_verbs;
    v_from text [];
    v_domain text := mailroom_internal._normalize_domain(p_domain);
    v_include boolean := coalesce(p_include_suppressed, false);
    v_where text;
    v_positions text;
    v_status text;
    v_found text [];
    v_eligible bigint;
    v_in_flight bigint;
    v_suppressed bigint;
    v_suppressed_ids bigint [];
    v_changed bigint;
    v_ids bigint [];
    v_domains text [];
    v_lifted bigint;
    v_set text;
BEGIN
    SELECT * INTO v_verb FROM mailroom.queue_verbs AS v WHERE v.verb = p_verb;
    v_from := v_verb.from_statuses;
    IF v_from IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('unknown queue verb %s', quote_literal(left(p_verb, 40)));
    END IF;
    IF num_nonnulls(p_ids, p_domain) + (CASE WHEN coalesce(p_all, false) THEN 1 ELSE 0 END) <> 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR344',
            MESSAGE = format('%s: name the messages one way: ids, a recipient domain, or all', p_verb);
    END IF;
    IF cardinality(p_ids) NOT BETWEEN 1 AND 100000 OR array_position(p_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR344',
            MESSAGE = format('%s: give 1 to 100000 message ids, none of them NULL', p_verb);
    END IF;
    IF v_domain = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR344',
            MESSAGE = format('%s: the recipient domain is empty', p_verb);
    END IF;
    IF p_status IS NOT NULL THEN
        PERFORM mailroom_internal._check_outbound_status(p_status);
        IF NOT p_status = ANY(v_from) THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR344',
                MESSAGE = format('%s applies to %s messages, not to %s ones',
                    p_verb, array_to_string(v_from, ', '), p_status);
        END IF;
        v_from := ARRAY[p_status];
    END IF;
    v_positions := CASE WHEN v_verb.checks_suppressed
        THEN 'mailroom_internal._suppressed_recipients(m.to_addrs, m.cc_addrs, m.bcc_addrs)'
        ELSE '''{}''::text[]'
    END;

    -- One message named alone: say why the verb cannot change it.
    IF cardinality(p_ids) = 1 THEN
        EXECUTE format(
            'SELECT m.status::text, %s FROM mailroom.outbound_messages AS m WHERE m.id = $1', v_positions
        ) INTO v_status, v_found USING p_ids[1];
        IF v_status IS NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR340',
                MESSAGE = format('no outbound message with id %s', p_ids[1]);
        END IF;
        IF v_status = 'processing' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR341',
                MESSAGE = format('message %s is being delivered (processing): wait for its outcome', p_ids[1]);
        END IF;
        IF NOT v_status = ANY(v_from) THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR341',
                MESSAGE = format('message %s is %s; %s applies to %s messages',
                    p_ids[1], v_status, replace(p_verb, '_', ' '), array_to_string(v_from, ', '));
        END IF;
        IF cardinality(v_found) > 0 AND NOT v_include THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR318',
                MESSAGE = format('message %s: %s on the suppression list now', p_ids[1],
                    array_to_string(v_found, ', ') || CASE WHEN cardinality(v_found) = 1 THEN ' is' ELSE ' are' END),
                HINT = 'retry_messages(…, p_include_suppressed => true) (`--include-suppressed`) sends it anyway';
        END IF;
    END IF;

    -- a domain or all: the messages made by now (all of them for a live operator; a session pinned
    -- before an installation existed, db verify's pgTAP, meets its own alone)
    v_where := CASE
        WHEN p_ids IS NOT NULL THEN 'm.id = ANY ($1)'
        WHEN v_domain IS NOT NULL THEN 'm.rcpt_domain = $2 AND m.created_at <= $5'
        ELSE 'm.created_at <= $5'
    END;
    IF v_verb.due = 'now' THEN
        -- only what is not due yet changes (a deferred retry, a send_after to come)
        v_where := v_where || ' AND (m.status <> ''queued'' OR m.next_retry_at > $5)';
    END IF;

    -- What the selection holds: messages the verb would change, those in flight, those with a
    -- recipient suppressed now (retry).
    EXECUTE format(
        'SELECT count(*) FILTER (WHERE x.eligible AND (cardinality(x.positions) = 0 OR $4)), '
        'count(*) FILTER (WHERE NOT x.eligible), '
        'count(*) FILTER (WHERE x.eligible AND cardinality(x.positions) > 0), '
        '(array_agg(x.id ORDER BY x.id) FILTER (WHERE x.eligible AND cardinality(x.positions) > 0))[1:20], '
        '(array_agg(x.id ORDER BY x.id) FILTER (WHERE x.eligible AND (cardinality(x.positions) = 0 OR $4)))[1:20] '
        'FROM (SELECT m.id, m.status <> ''processing'' AS eligible, %s AS positions '
        'FROM mailroom.outbound_messages AS m '
        'WHERE %s AND m.status = ANY ($3::mailroom.outbound_status[] || ''{processing}''::mailroom.outbound_status[])) AS x',
        v_positions, v_where
    ) INTO v_eligible, v_in_flight, v_suppressed, v_suppressed_ids, v_ids
    USING p_ids, v_domain, v_from, v_include, v_now;

    IF coalesce(p_dry_run, false) THEN
        RETURN QUERY SELECT v_eligible, v_in_flight, v_suppressed, coalesce(v_ids, '{}'), coalesce(v_suppressed_ids, '{}');
        RETURN;
    END IF;

    -- The change, on the rows no one else holds (a claim in progress holds its rows: in flight).
    -- What the verb's row sets, as fixed fragments with its values quoted in; the log limit written
    -- into the text too: the function in SET is then IMMUTABLE (Citus).
    v_set := concat_ws(', ',
        CASE WHEN v_verb.to_status IS NOT NULL THEN format('status = %L', v_verb.to_status) END,
        CASE v_verb.due WHEN 'clear' THEN 'next_retry_at = NULL' WHEN 'now' THEN 'next_retry_at = $5' END,
        CASE WHEN v_verb.fresh_attempts
            THEN 'attempts = 0, claimed_by = NULL, claim_token = NULL, lease_expires_at = NULL'
        END,
        format('error_log = mailroom_internal._operator_log(m.error_log, $5, %L, %s)',
            v_verb.log_line, mailroom.setting('outbound.error_log_max_chars')::integer)
    );
    SELECT c.changed, c.ids, c.domains INTO v_changed, v_ids, v_domains
    FROM mailroom_internal._queue_verb_change(p_verb, v_where, v_positions, v_set, p_ids, v_domain, v_from, v_include, v_now) AS c;

    IF v_verb.due = 'now' THEN
        -- due now means the domain's backoff too (sql/39): lifted for the domain named, for every
        -- domain (all), or for the domains of the messages named
        WITH lifted AS (
            UPDATE mailroom.domain_state AS s
            SET backoff_until = NULL, backoff_level = 0, updated_at = v_now
            WHERE (s.backoff_until IS NOT NULL OR s.backoff_level > 0)
                AND (
                    coalesce(p_all, false)
                    OR s.domain = v_domain
                    OR s.domain IN (
                        SELECT m.rcpt_domain FROM mailroom.outbound_messages AS m
                        WHERE m.id = ANY(p_ids) AND m.status = 'queued'
                    )
                )
            RETURNING 1
        )

        SELECT count(*) INTO v_lifted FROM lifted;
        IF v_lifted > 0 THEN
            RAISE NOTICE USING MESSAGE = format('lifted the backoff of %s recipient domain(s)', v_lifted);
        END IF;
    END IF;
    IF v_verb.wakes_senders AND (v_changed > 0 OR v_lifted > 0) THEN
        PERFORM pg_notify('mailroom_outbound', coalesce(v_ids[1]::text, ''));  -- wake the senders
    END IF;
    RETURN QUERY SELECT
        v_changed,
        v_in_flight + greatest(v_eligible - v_changed, 0),
        v_suppressed,
        coalesce(v_ids, '{}'),
        coalesce(v_suppressed_ids, '{}');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._queue_verb(text, bigint[], text, boolean, text, boolean, boolean) IS
'Internal: one operator verb (a row of mailroom.queue_verbs) on the messages named by ids, a recipient domain or all; see the top of sql/37_outbound_queue.sql.';

CREATE OR REPLACE FUNCTION mailroom.hold_messages(
    p_ids bigint[] DEFAULT null,
    p_domain text DEFAULT null,
    p_all boolean DEFAULT false,
    p_status text DEFAULT null,
    p_dry_run boolean DEFAULT false
)
RETURNS TABLE (changed bigint, in_flight bigint, suppressed bigint, sample_ids bigint[], suppressed_ids bigint[])
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM mailroom_internal._queue_verb('hold', p_ids, p_domain, p_all, p_status, p_dry_run)
$$;

COMMENT ON FUNCTION mailroom.hold_messages(bigint[], text, boolean, text, boolean) IS
'Put queued messages (ids, a recipient domain, or all) on hold: no claim takes them until released (postsuper -h).';

GRANT EXECUTE ON FUNCTION mailroom.hold_messages(bigint[], text, boolean, text, boolean) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.release_held_messages(
    p_ids bigint[] DEFAULT null,
    p_domain text DEFAULT null,
    p_all boolean DEFAULT false,
    p_status text DEFAULT null,
    p_dry_run boolean DEFAULT false
)
RETURNS TABLE (changed bigint, in_flight bigint, suppressed bigint, sample_ids bigint[], suppressed_ids bigint[])
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM mailroom_internal._queue_verb('release', p_ids, p_domain, p_all, p_status, p_dry_run)
$$;

COMMENT ON FUNCTION mailroom.release_held_messages(bigint[], text, boolean, text, boolean) IS
'Release held messages back to the queue, due when they were (postsuper -H).';

GRANT EXECUTE ON FUNCTION mailroom.release_held_messages(bigint[], text, boolean, text, boolean) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.cancel_messages(
    p_ids bigint[] DEFAULT null,
    p_domain text DEFAULT null,
    p_all boolean DEFAULT false,
    p_status text DEFAULT null,
    p_dry_run boolean DEFAULT false
)
RETURNS TABLE (changed bigint, in_flight bigint, suppressed bigint, sample_ids bigint[], suppressed_ids bigint[])
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM mailroom_internal._queue_verb('cancel', p_ids, p_domain, p_all, p_status, p_dry_run)
$$;

COMMENT ON FUNCTION mailroom.cancel_messages(bigint[], text, boolean, text, boolean) IS
'Cancel queued or held messages: never sent, kept as cancelled until retention (retry_messages can queue them again).';

GRANT EXECUTE ON FUNCTION mailroom.cancel_messages(bigint[], text, boolean, text, boolean) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.delete_messages(
    p_ids bigint[] DEFAULT null,
    p_domain text DEFAULT null,
    p_all boolean DEFAULT false,
    p_status text DEFAULT null,
    p_dry_run boolean DEFAULT false
)
RETURNS TABLE (changed bigint, in_flight bigint, suppressed bigint, sample_ids bigint[], suppressed_ids bigint[])
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM mailroom_internal._queue_verb('delete', p_ids, p_domain, p_all, p_status, p_dry_run)
$$;

COMMENT ON FUNCTION mailroom.delete_messages(bigint[], text, boolean, text, boolean) IS
'Delete messages of any status but processing, with their idempotency keys (postsuper -d).';

GRANT EXECUTE ON FUNCTION mailroom.delete_messages(bigint[], text, boolean, text, boolean) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.run_messages_now(
    p_ids bigint[] DEFAULT null,
    p_domain text DEFAULT null,
    p_all boolean DEFAULT false,
    p_status text DEFAULT null,
    p_dry_run boolean DEFAULT false
)
RETURNS TABLE (changed bigint, in_flight bigint, suppressed bigint, sample_ids bigint[], suppressed_ids bigint[])
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM mailroom_internal._queue_verb('run_now', p_ids, p_domain, p_all, p_status, p_dry_run)
$$;

COMMENT ON FUNCTION mailroom.run_messages_now(bigint[], text, boolean, text, boolean) IS
'Make queued messages due now (a deferred retry, a send_after to come) and lift their domains'' backoff; NOTIFY the senders (postqueue -f, postqueue -s).';

GRANT EXECUTE ON FUNCTION mailroom.run_messages_now(bigint[], text, boolean, text, boolean) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.retry_messages(
    p_ids bigint[] DEFAULT null,
    p_domain text DEFAULT null,
    p_all boolean DEFAULT false,
    p_status text DEFAULT null,
    p_dry_run boolean DEFAULT false,
    p_include_suppressed boolean DEFAULT false
)
RETURNS TABLE (changed bigint, in_flight bigint, suppressed bigint, sample_ids bigint[], suppressed_ids bigint[])
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM mailroom_internal._queue_verb('retry', p_ids, p_domain, p_all, p_status, p_dry_run, p_include_suppressed)
$$;

COMMENT ON FUNCTION mailroom.retry_messages(bigint[], text, boolean, text, boolean, boolean) IS
'Queue failed, cancelled or held messages again, due now with a fresh attempt budget; those with a recipient suppressed since are left alone and counted unless p_include_suppressed (postsuper -r).';

GRANT EXECUTE ON FUNCTION mailroom.retry_messages(bigint[], text, boolean, text, boolean, boolean) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.retry_message(p_id bigint)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- MR340 unknown, MR341 not failed, cancelled or held, MR318 a recipient suppressed since
    SELECT p_id FROM mailroom_internal._queue_verb('retry', ARRAY[p_id], null, false, null, false)
$$;

COMMENT ON FUNCTION mailroom.retry_message(bigint) IS
'Queue one failed, cancelled or held message again with a fresh attempt budget (MR318 when a recipient was suppressed since).';

GRANT EXECUTE ON FUNCTION mailroom.retry_message(bigint) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.retry_failed_messages()
RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.changed::integer FROM mailroom_internal._queue_verb('retry', null, null, true, 'failed', false) AS r
$$;

COMMENT ON FUNCTION mailroom.retry_failed_messages() IS
'Queue every failed message again with a fresh attempt budget, but those with a recipient suppressed since; returns how many.';

GRANT EXECUTE ON FUNCTION mailroom.retry_failed_messages() TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.outbound_queue(p_limit integer DEFAULT 20)
RETURNS TABLE (
    domain text,
    queued bigint,
    due bigint,
    held_back bigint,
    deferred bigint,
    scheduled bigint,
    held bigint,
    processing bigint,
    oldest_age_seconds double precision,
    backoff_until timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_blocked text [] := ARRAY(SELECT b.domain FROM mailroom_internal._blocked_domains(v_now) AS b);
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR343',
            MESSAGE = format('list limit must be between 1 and 10000, got %s', coalesce(p_limit::text, 'NULL'));
    END IF;
    -- The mail waiting, by recipient domain, most first: queued (due now; held back by the
    -- domain's limit or backoff; deferred after a failed attempt; scheduled by send_after), held,
    -- being delivered; how long the oldest waits; the domain's backoff.
    RETURN QUERY
    SELECT
        m.rcpt_domain,
        count(*) FILTER (WHERE m.status = 'queued'),
        count(*) FILTER (
            WHERE m.status = 'queued' AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= v_now
            AND m.rcpt_domain <> ALL (v_blocked)
        ),
        count(*) FILTER (
            WHERE m.status = 'queued' AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= v_now
            AND m.rcpt_domain = ANY (v_blocked)
        ),
        count(*) FILTER (WHERE m.status = 'queued' AND m.attempts > 0 AND m.next_retry_at > v_now),
        count(*) FILTER (WHERE m.status = 'queued' AND m.attempts = 0 AND m.next_retry_at > v_now),
        count(*) FILTER (WHERE m.status = 'held'),
        count(*) FILTER (WHERE m.status = 'processing'),
        extract(EPOCH FROM v_now - min(m.created_at))::double precision,
        (SELECT s.backoff_until FROM mailroom.domain_state AS s WHERE s.domain = m.rcpt_domain AND s.backoff_until > v_now)
    FROM mailroom.outbound_messages AS m
    -- made by now: every row for a live operator (a clock pinned before them leaves them out)
    WHERE m.status IN ('queued', 'held', 'processing') AND m.created_at <= v_now
    GROUP BY m.rcpt_domain
    ORDER BY count(*) DESC, m.rcpt_domain
    LIMIT p_limit;
END;
$$;

COMMENT ON FUNCTION mailroom.outbound_queue(integer) IS
'The mail waiting by recipient domain, most first (mailq): queued, due, held back by limits, deferred, scheduled, held, processing, oldest age, backoff. Errors: MR343 bad limit.';

GRANT EXECUTE ON FUNCTION mailroom.outbound_queue(integer) TO mailroom_monitor, mailroom_admin;
