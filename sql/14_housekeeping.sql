-- Housekeeping: old, finished tokens can be deleted (they keep only digests,
-- but the table need not grow forever).

CREATE OR REPLACE FUNCTION mailroom.purge_tokens(p_older_than interval DEFAULT '7 days')
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '1 day' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'purge_tokens: keep at least 1 day of tokens (the recovery rate limit counts them)';
    END IF;
    RETURN mailroom_internal._delete_tokens_before(mailroom.clock() - p_older_than);
END;
$$;

COMMENT ON FUNCTION mailroom.purge_tokens(interval) IS
'Delete tokens that expired more than p_older_than ago (default 7 days, at least 1 day); returns how many.';

GRANT EXECUTE ON FUNCTION mailroom.purge_tokens(interval) TO mailroom_admin;

-- A Citus seam (mailroom.db.citus.SEAMS): the delete of purge_tokens. On one node one statement;
-- on Citus (sql/citus/13_token_digests.sql) the deleted tokens' token_digests rows go with them.
CREATE OR REPLACE FUNCTION mailroom_internal._delete_tokens_before(p_cutoff timestamptz)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count bigint;
BEGIN
    DELETE FROM mailroom.tokens AS t
    WHERE t.expires_at < p_cutoff
        AND t.created_at < p_cutoff;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delete_tokens_before(timestamptz) IS
'Internal (a Citus seam): delete the tokens created and expired before p_cutoff (purge_tokens); returns how many.';
