-- The error vocabulary: every MRnnn SQLSTATE the API raises is a row of mailroom.error_codes
-- (migration 0110): its area, its kind for a caller, its meaning, and the SMTP reply the inbound
-- server answers with (and the check_recipient verdict it stands for) where one applies. The
-- driver reads the rows once a process connects (error_codes()) and classifies errors by them;
-- SQL answers SMTP replies from them (_verdict_reply). pgTAP 04 checks the table against every
-- RAISE … ERRCODE = 'MRnnn' in the schema's functions.

CREATE OR REPLACE FUNCTION mailroom.error_codes()
RETURNS TABLE (code text, area text, kind text, meaning text, smtp_reply text, verdict text, http_status smallint)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL: its body is not checked against the table when sql/ is applied (a schema migrated
    -- to an older version still takes the sql/ pass)
    RETURN QUERY
    SELECT e.code, e.area, e.kind, e.meaning, e.smtp_reply, e.verdict, e.http_status
    FROM mailroom.error_codes AS e
    ORDER BY e.code;
END;
$$;

COMMENT ON FUNCTION mailroom.error_codes() IS
'Every MRnnn SQLSTATE of the API: area, kind (usage, config, not_found, gone, limit, conflict, denied), meaning, SMTP reply and recipient verdict where one applies, HTTP status where it says more than the kind.';

GRANT EXECUTE ON FUNCTION mailroom.error_codes()
TO mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_monitor, mailroom_http;

CREATE OR REPLACE FUNCTION mailroom_internal._verdict_reply(p_verdict text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The SMTP reply of a refusing check_recipient verdict (NULL for ok and bounce: 250).
    RETURN (SELECT e.smtp_reply FROM mailroom.error_codes AS e WHERE e.verdict = p_verdict);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._verdict_reply(text) IS
'Internal: the SMTP reply of a refusing recipient verdict (unknown, deleted, expired, too_large, full), from mailroom.error_codes; NULL otherwise.';

CREATE OR REPLACE FUNCTION mailroom_internal._code_reply(p_code text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The SMTP reply of an MRnnn refusal (NULL when the code has none: not a refusal of mail).
    RETURN (SELECT e.smtp_reply FROM mailroom.error_codes AS e WHERE e.code = p_code);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._code_reply(text) IS
'Internal: the SMTP reply of an MRnnn SQLSTATE from mailroom.error_codes, NULL when it has none.';
