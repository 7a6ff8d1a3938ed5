-- One rate and allow-list mechanism (issue 45; docs/architecture.md, "One rate and allow-list
-- mechanism"), for release, the checks, and later send over HTTP and failed SMTP logins:
--   _take_rate(scope, subject, setting): one more for the subject (an id or a digest, never an
--     address) within the limit of a setting of kind rate ("N/min": at most N in the current
--     minute; "N/h": at most N in the last 60 one-minute windows); over it MR020 (HTTP 429), the
--     message saying when to retry, DETAIL the seconds (the HTTP face's Retry-After).
--   _recipient_allowed(setting, address): whether the address matches one of the comma-separated
--     address globs of a setting of kind globs ("*" any run of characters, nothing else special,
--     case-insensitive); an empty list allows none. _require_recipient_allowed raises MR021.
--   _audit(...): one line of mailroom.audit_log (no address).
-- The windows live in mailroom.rate_windows (migration 0430), one row per scope, subject and minute;
-- _prune_rates_and_audit (called by maintain_partitions, sql/05_partitions.sql) deletes the windows
-- past the longest limit and the audit lines past audit.retention. Time is mailroom.clock().

CREATE OR REPLACE FUNCTION mailroom_internal._take_rate(p_scope text, p_subject text, p_setting text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_value text := mailroom.setting(p_setting);
    v_limit bigint := split_part(v_value, '/', 1)::bigint;
    v_period interval := CASE split_part(v_value, '/', 2) WHEN 'h' THEN interval '1 hour' ELSE interval '1 minute' END;
    v_now timestamptz := mailroom.clock();
    v_window timestamptz := pg_catalog.date_bin(interval '1 minute', mailroom.clock(), '2000-01-03 00:00:00+00'::timestamptz);
    v_total bigint;
    v_free_at timestamptz;
    v_wait bigint;
BEGIN
    -- the row of this minute first: its lock makes concurrent takers of one subject count in turn
    INSERT INTO mailroom.rate_windows AS r (scope, subject, window_start, hits)
    VALUES (p_scope, p_subject, v_window, 1)
    ON CONFLICT (scope, subject, window_start) DO UPDATE SET hits = r.hits + 1;
    SELECT sum(r.hits) INTO v_total
    FROM mailroom.rate_windows AS r
    WHERE r.scope = p_scope AND r.subject = p_subject
        AND r.window_start > v_window - v_period AND r.window_start <= v_window;
    IF v_total <= v_limit THEN
        RETURN;
    END IF;
    -- over: the earliest window whose passing leaves room for one more (the oldest first)
    SELECT w.window_start + v_period INTO v_free_at
    FROM (
        SELECT r.window_start, sum(r.hits) OVER (ORDER BY r.window_start) AS gone
        FROM mailroom.rate_windows AS r
        WHERE r.scope = p_scope AND r.subject = p_subject
            AND r.window_start > v_window - v_period AND r.window_start <= v_window
    ) AS w
    WHERE v_total - 1 - w.gone < v_limit
    ORDER BY w.window_start
    LIMIT 1;
    v_wait := greatest(1, ceil(extract(EPOCH FROM coalesce(v_free_at, v_window + v_period) - v_now)))::bigint;
    RAISE EXCEPTION USING
        ERRCODE = 'MR020',
        MESSAGE = format('rate limit reached: %s allows %s; try again in %s seconds', p_setting, v_value, v_wait),
        DETAIL = v_wait::text;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._take_rate(text, text, text) IS
'Internal: count one for (scope, subject) within the rate setting ("N/min", "N/h" over one-minute windows); MR020 with the seconds to wait (DETAIL) when over.';

CREATE OR REPLACE FUNCTION mailroom_internal._recipient_allowed(p_setting text, p_address text)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- each glob as a LIKE pattern: \ % _ escaped, * becomes %; compared in lower case
    SELECT coalesce(bool_or(
        lower(btrim(p_address)) LIKE replace(
            replace(replace(replace(lower(btrim(g.item)), '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'
        ) ESCAPE '\'
    ), false)
    FROM regexp_split_to_table(mailroom.setting(p_setting), ',') AS g (item)
    WHERE btrim(g.item) <> '' AND p_address IS NOT NULL
$$;

COMMENT ON FUNCTION mailroom_internal._recipient_allowed(text, text) IS
'Internal: whether the address matches a glob of the comma-separated setting ("*" any run of characters, case-insensitive); an empty list allows none.';

CREATE OR REPLACE FUNCTION mailroom_internal._require_recipient_allowed(p_setting text, p_address text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT mailroom_internal._recipient_allowed(p_setting, p_address) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR021',
            MESSAGE = format('this recipient is not allowed: it matches none of %s%s', p_setting,
                CASE WHEN btrim(mailroom.setting(p_setting)) = '' THEN ' (empty: none is allowed)' ELSE '' END);
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._require_recipient_allowed(text, text) IS
'Internal: MR021 unless the address matches the allow-list setting (_recipient_allowed); the message names the setting, never the address.';

CREATE OR REPLACE FUNCTION mailroom_internal._audit(
    p_action text,
    p_key_id bigint,
    p_owner_type text,
    p_owner_id text,
    p_mailbox_id bigint,
    p_message_id bigint,
    p_outbound_id bigint,
    p_recipients integer
)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO mailroom.audit_log (
        at, action, key_id, owner_type, owner_id, mailbox_id, message_id, outbound_id, recipients
    )
    VALUES (
        mailroom.clock(), p_action, p_key_id, p_owner_type, p_owner_id, p_mailbox_id, p_message_id,
        p_outbound_id, p_recipients
    )
$$;

COMMENT ON FUNCTION mailroom_internal._audit(text, bigint, text, text, bigint, bigint, bigint, integer) IS
'Internal: one line of mailroom.audit_log (when, what, key id or owner, the ids involved, how many recipients; no address).';

CREATE OR REPLACE FUNCTION mailroom_internal._prune_rates_and_audit(p_batch integer)
RETURNS TABLE (action text, table_name text, row_count bigint)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_count bigint;
BEGIN
    -- rate windows past the longest limit (an hour), in batches as the other deletions of maintenance
    WITH doomed AS (
        SELECT r.scope, r.subject, r.window_start
        FROM mailroom.rate_windows AS r
        WHERE r.window_start < v_now - interval '1 hour 1 minute'
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    )

    DELETE FROM mailroom.rate_windows AS r
    USING doomed AS d
    WHERE r.scope = d.scope AND r.subject = d.subject AND r.window_start = d.window_start;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        RETURN QUERY SELECT 'windows_deleted'::text, 'rate_windows'::text, v_count;
    END IF;
    WITH doomed AS (
        SELECT a.id
        FROM mailroom.audit_log AS a
        WHERE a.at < v_now - mailroom.setting('audit.retention')::interval
        ORDER BY a.at
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    )

    DELETE FROM mailroom.audit_log AS a
    USING doomed AS d
    WHERE a.id = d.id;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        RETURN QUERY SELECT 'audit_deleted'::text, 'audit_log'::text, v_count;
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._prune_rates_and_audit(integer) IS
'Internal: delete (at most p_batch each) the rate windows older than an hour and the audit lines past audit.retention; report rows for maintain_partitions.';
