-- The MCP face's functions of 0.1, kept for 0.2.x callers: each a thin wrapper of the operation's
-- http_* function (the one SQL function both faces call, driver/mailroom/api/operations.py and
-- docs/inbox-api.md), with the API key required first (_mcp_key: MR240 without one). No query of its
-- own: the MCP server of 0.2 calls the http_* functions directly.
-- Deprecated since 0.2.0, removed in 0.3.0 (the previous release's MCP server calls them).

CREATE OR REPLACE FUNCTION mailroom_internal._mcp_key(p_key_digest bytea)
RETURNS bytea
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the MCP face's own MR240 wording (it knows only API keys); the key itself is then judged by
    -- the HTTP face's owner rule (_http_who, _http_box in sql/29_http.sql: issue 36, one rule)
    IF p_key_digest IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR240', MESSAGE = 'credentials required: an API key';
    END IF;
    RETURN p_key_digest;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._mcp_key(bytea) IS
'Internal: the API key digest of an MCP request, MR240 without one (then _http_who/_http_box decide, the owner rule of both faces).';

CREATE OR REPLACE FUNCTION mailroom.mcp_create_mailbox(
    p_key_digest bytea,
    p_ttl_minutes integer DEFAULT null,
    p_plan text DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_create_mailbox(
            p_key_digest => mailroom_internal._mcp_key(p_key_digest), p_client => NULL,
            p_ttl_minutes => p_ttl_minutes, p_plan => p_plan, p_face => 'mcp'
        ) - 'session_token';
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_create_mailbox(bytea, integer, text) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_create_mailbox(…, p_face => ''mcp''). MCP create_inbox of 0.1: an inbox owned by (mcp, the API key''s owner).';

GRANT EXECUTE ON FUNCTION mailroom.mcp_create_mailbox(bytea, integer, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_list_mailboxes(
    p_key_digest bytea, p_limit integer DEFAULT 100
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_list_mailboxes(mailroom_internal._mcp_key(p_key_digest), p_limit, 0, false);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_list_mailboxes(bytea, integer) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_list_mailboxes(…). MCP list_inboxes of 0.1: the key''s open api and mcp inboxes, newest first.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_list_mailboxes(bytea, integer) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_list_messages(
    p_address text,
    p_key_digest bytea,
    p_limit integer DEFAULT 20,
    p_offset integer DEFAULT 0
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_mailbox_view(p_address, NULL, mailroom_internal._mcp_key(p_key_digest), p_limit, p_offset)
            || jsonb_build_object('limit', p_limit, 'offset', p_offset);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_list_messages(text, bytea, integer, integer) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_list_messages(…) or http_mailbox_view(…). MCP list_messages of 0.1: {mailbox, messages, limit, offset}.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_list_messages(text, bytea, integer, integer) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_read_message(
    p_address text, p_key_digest bytea, p_message_id bigint
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (
            SELECT d || jsonb_build_object('to', d -> 'to_address', 'text', d -> 'body_text', 'html', d -> 'body_html')
            FROM mailroom.http_read_message(p_address, NULL, mailroom_internal._mcp_key(p_key_digest), p_message_id) AS d
        );
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_read_message(text, bytea, bigint) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_read_message(…). MCP read_message of 0.1: the REST Message with the keys to, text and html.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_read_message(text, bytea, bigint) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_check_message(
    p_address text,
    p_key_digest bytea,
    p_subject_like text DEFAULT null,
    p_last boolean DEFAULT false
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_wait_look(
        p_address, NULL, mailroom_internal._mcp_key(p_key_digest), p_subject_like, NULL, p_last
    );
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_check_message(text, bytea, text, boolean) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_wait_look(…). MCP wait_for_message of 0.1: one look without waiting, {mailbox_id, message, …}.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_check_message(text, bytea, text, boolean) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_extract_link(
    p_address text,
    p_key_digest bytea,
    p_message_id bigint,
    p_url_like text DEFAULT null
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_extract_link(p_address, NULL, mailroom_internal._mcp_key(p_key_digest), p_message_id, p_url_like);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_extract_link(text, bytea, bigint, text) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_extract_link(…). MCP extract_link of 0.1.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_extract_link(text, bytea, bigint, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_extract_code(
    p_address text,
    p_key_digest bytea,
    p_message_id bigint,
    p_pattern text DEFAULT null
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_extract_code(p_address, NULL, mailroom_internal._mcp_key(p_key_digest), p_message_id, p_pattern);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_extract_code(text, bytea, bigint, text) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_extract_code(…). MCP extract_code of 0.1.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_extract_code(text, bytea, bigint, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_delete_mailbox(
    p_address text, p_key_digest bytea
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_delete_mailbox(p_address, NULL, mailroom_internal._mcp_key(p_key_digest));
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_delete_mailbox(text, bytea) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_delete_mailbox(…). MCP delete_inbox of 0.1.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_delete_mailbox(text, bytea) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_mark_message(
    p_address text,
    p_key_digest bytea,
    p_message_id bigint,
    p_is_read boolean DEFAULT null,
    p_tags text[] DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_update_message(
            p_address, NULL, mailroom_internal._mcp_key(p_key_digest), p_message_id, p_is_read, p_tags
        );
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_mark_message(text, bytea, bigint, boolean, text[]) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_update_message(…). MCP mark_message of 0.1.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_mark_message(text, bytea, bigint, boolean, text[]) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_clear_messages(
    p_address text, p_key_digest bytea
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_clear_messages(p_address, NULL, mailroom_internal._mcp_key(p_key_digest));
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_clear_messages(text, bytea) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_clear_messages(…). MCP clear_inbox of 0.1.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_clear_messages(text, bytea) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_extend_mailbox(
    p_address text, p_key_digest bytea, p_ttl_seconds integer
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_extend_mailbox(p_address, NULL, mailroom_internal._mcp_key(p_key_digest), p_ttl_seconds);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_extend_mailbox(text, bytea, integer) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_extend_mailbox(…). MCP extend_inbox of 0.1.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_extend_mailbox(text, bytea, integer) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_set_inbox_fault(
    p_address text,
    p_key_digest bytea,
    p_stage text,
    p_reply text,
    p_share numeric DEFAULT 100,
    p_count integer DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_set_inbox_fault(
            p_address, NULL, mailroom_internal._mcp_key(p_key_digest), p_stage, p_reply, p_share, p_count
        );
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_set_inbox_fault(text, bytea, text, text, numeric, integer) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_set_inbox_fault(…). MCP set_inbox_fault of 0.1.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_set_inbox_fault(text, bytea, text, text, numeric, integer) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_clear_inbox_fault(
    p_address text, p_key_digest bytea
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.http_clear_inbox_fault(p_address, NULL, mailroom_internal._mcp_key(p_key_digest));
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_clear_inbox_fault(text, bytea) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_clear_inbox_fault(…). MCP clear_inbox_fault of 0.1.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_clear_inbox_fault(text, bytea) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_error_codes()
RETURNS TABLE (function_name text, code text, meaning text)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the 0.1 server's catalog, derived: each mcp_* function's codes are the Errors: list of the http_*
    -- function it wraps now (its COMMENT, the one place an operation's codes are written), the key's
    -- two ('*': every function) apart, with their meaning in MCP's words (face_error_meanings)
    RETURN QUERY WITH listed AS (
        SELECT
            t.fn,
            c.code,
            c.n
        FROM (VALUES
            ('mcp_create_mailbox', 'http_create_mailbox'),
            ('mcp_list_messages', 'http_list_messages'),
            ('mcp_read_message', 'http_read_message'),
            ('mcp_check_message', 'http_wait_look'),
            ('http_wait_look', 'http_wait_look'),
            ('mcp_extract_link', 'http_extract_link'),
            ('mcp_extract_code', 'http_extract_code'),
            ('mcp_delete_mailbox', 'http_delete_mailbox'),
            ('mcp_mark_message', 'http_update_message'),
            ('mcp_clear_messages', 'http_clear_messages'),
            ('mcp_extend_mailbox', 'http_extend_mailbox'),
            ('mcp_set_inbox_fault', 'http_set_inbox_fault'),
            ('mcp_clear_inbox_fault', 'http_clear_inbox_fault')
        ) AS t (fn, http_fn)
        CROSS JOIN LATERAL (
            SELECT d.description
            FROM pg_catalog.pg_proc AS p
            INNER JOIN pg_catalog.pg_description AS d ON p.oid = d.objoid AND d.classoid = 'pg_catalog.pg_proc'::regclass
            WHERE p.pronamespace = 'mailroom'::regnamespace AND p.proname = t.http_fn
            LIMIT 1
        ) AS f
        CROSS JOIN LATERAL unnest(
            string_to_array(substring(f.description FROM 'Errors: ((?:MR[0-9]{3}(?:, )?)+)\.'), ', ')
        ) WITH ORDINALITY AS c (code, n)
        WHERE c.code NOT IN (SELECT k.code FROM (VALUES ('MR240'), ('MR241')) AS k (code))
        UNION ALL
        SELECT '*', k.code, k.n FROM (VALUES ('MR240', 1), ('MR241', 2)) AS k (code, n)
    )
    SELECT l.fn, l.code, m.meaning
    FROM listed AS l
    INNER JOIN mailroom.face_error_meanings('mcp') AS m ON l.code = m.code
    ORDER BY l.fn, l.n;
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_error_codes() IS
'Deprecated since 0.2.0, removed in 0.3.0: use the errors of each operation (driver/mailroom/api/operations.py, docs/inbox-api.md) and mailroom.error_codes(). The MR codes each 0.1 mcp_* function may raise (function * : every one), in the order a tool description names them, with their meaning.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_error_codes() TO mailroom_http;
