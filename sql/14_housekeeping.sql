-- Housekeeping: old, finished tokens can be deleted (they keep only digests,
-- but the table need not grow forever).

CREATE OR REPLACE FUNCTION mailroom.purge_tokens(p_older_than interval DEFAULT '7 days')
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_count bigint;
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '1 day' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'purge_tokens: keep at least 1 day of tokens (the recovery rate limit counts them)';
    END IF;
    DELETE FROM mailroom.tokens
    WHERE expires_at < v_now - p_older_than
        AND created_at < v_now - p_older_than;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom.purge_tokens(interval) IS
'Delete tokens that expired more than p_older_than ago (default 7 days, at least 1 day); returns how many.';

GRANT EXECUTE ON FUNCTION mailroom.purge_tokens(interval) TO mailroom_admin;
