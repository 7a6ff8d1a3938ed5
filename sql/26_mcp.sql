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
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- the refusals each MCP function may answer, with their meaning (mailroom.error_codes): the
    -- server writes them into the tool descriptions an agent reads, and keeps no list of its own.
    -- Where a meaning speaks of what MCP has not (a session token), the MCP face's own words (MR240:
    -- _mcp_key's)
    SELECT
        t.fn,
        c.code,
        coalesce(w.words, e.meaning) AS meaning
    FROM (VALUES
        ('mcp_create_mailbox', ARRAY['MR201', 'MR202', 'MR243']),
        ('mcp_list_messages', ARRAY['MR203', 'MR204', 'MR205', 'MR206']),
        ('mcp_read_message', ARRAY['MR209', 'MR203', 'MR204', 'MR205', 'MR206']),
        ('mcp_check_message', ARRAY['MR212', 'MR205', 'MR206', 'MR203', 'MR204']),
        -- MCP wait_for_message: the one wait's look, and the server's caps on waits (wait_refused)
        ('http_wait_look', ARRAY['MR212', 'MR205', 'MR206', 'MR251', 'MR252', 'MR203', 'MR204']),
        ('mcp_extract_link', ARRAY['MR215', 'MR011', 'MR209', 'MR203', 'MR204', 'MR205', 'MR206']),
        ('mcp_extract_code', ARRAY['MR215', 'MR010', 'MR034', 'MR209', 'MR203', 'MR204', 'MR205', 'MR206']),
        ('mcp_delete_mailbox', ARRAY['MR203', 'MR204']),
        ('mcp_mark_message', ARRAY['MR209', 'MR260', 'MR261', 'MR203', 'MR204', 'MR205', 'MR206']),
        ('mcp_clear_messages', ARRAY['MR203', 'MR204', 'MR205', 'MR206']),
        ('mcp_extend_mailbox', ARRAY['MR202', 'MR203', 'MR204', 'MR205', 'MR206']),
        ('mcp_set_inbox_fault', ARRAY['MR230', 'MR231', 'MR232', 'MR203', 'MR204', 'MR205', 'MR206']),
        ('mcp_clear_inbox_fault', ARRAY['MR203', 'MR204']),
        ('*', ARRAY['MR240', 'MR241'])  -- every function: the API key
    ) AS t (fn, codes)
    CROSS JOIN LATERAL unnest(t.codes) WITH ORDINALITY AS c (code, n)
    INNER JOIN mailroom.error_codes AS e ON c.code = e.code
    LEFT JOIN (VALUES
        ('MR204', 'the inbox is not this API key''s owner''s'),
        ('MR240', 'credentials required: an API key')
    ) AS w (code, words) ON c.code = w.code
    ORDER BY t.fn, c.n
$$;

COMMENT ON FUNCTION mailroom.mcp_error_codes() IS
'Deprecated since 0.2.0, removed in 0.3.0: use the errors of each operation (driver/mailroom/api/operations.py, docs/inbox-api.md) and mailroom.error_codes(). The MR codes each 0.1 mcp_* function may raise (function * : every one), in the order a tool description names them, with their meaning.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_error_codes() TO mailroom_http;
