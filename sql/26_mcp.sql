-- The MCP face of the inboxes (`mailroom mcp`, docs/mcp.md): one function per tool, each one call
-- as mailroom_http, authorized by an API key's sha256 digest (the key never reaches the database).
-- An inbox an agent creates is owned by (mcp, the key's owner); the key reads every open inbox of
-- its owner of owner type api or mcp, so what an agent made over MCP and what a client made over
-- REST are the same owner's. Thin wrappers of the SQL API the CLI and psql use (create_mailbox,
-- read_message, extract_link, extract_code, delete_mailbox) and of the HTTP face's JSON
-- (sql/29_http.sql), so an MCP answer and a REST answer have the same shape.
-- Who may use an inbox is the HTTP face's rule, the one rule of both faces (issue 36: _http_who
-- and _http_box of sql/29_http.sql); only MR240's wording is the MCP face's own (_mcp_key).
-- Fault injection (sql/24_faults.sql): mcp_set_inbox_fault, mcp_clear_inbox_fault.
-- Errors: those of the wrapped functions (MR201-MR215, MR230-MR232), MR240 no API key, MR241 unknown
-- or revoked key, MR243 the REST API's creation rate limit (shared with REST: one quota per key).

CREATE OR REPLACE FUNCTION mailroom_internal._mcp_owner(p_key_digest bytea)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the MCP face knows only API keys: no key is MR240 (_mcp_key), a bad one MR241 (_api_key_owner)
    RETURN mailroom_internal._api_key_owner(mailroom_internal._mcp_key(p_key_digest));
END;
$$;

COMMENT ON FUNCTION mailroom_internal._mcp_owner(bytea) IS
'Internal: the owner id of an MCP request''s API key; MR240 without one, MR241 for a bad one.';

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

CREATE OR REPLACE FUNCTION mailroom_internal._mcp_box(p_address text, p_key_digest bytea)
RETURNS mailroom.mailboxes
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom_internal._http_box(p_address, NULL, mailroom_internal._mcp_key(p_key_digest));
END;
$$;

COMMENT ON FUNCTION mailroom_internal._mcp_box(text, bytea) IS
'Internal: the open api or mcp inbox of the API key''s owner, by the HTTP face''s rule (_http_box: MR203-MR206, MR241), MR240 without a key.';

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
DECLARE
    v_owner text := mailroom_internal._mcp_owner(p_key_digest);
    v_created record;
    v_box mailroom.mailboxes;
BEGIN
    -- the REST API's creation limit, counted on the same subject: a key has one quota for both faces
    PERFORM mailroom_internal._http_rate_take(p_key_digest);
    SELECT c.mailbox_id INTO v_created
    FROM mailroom.create_mailbox(
        p_ttl_minutes, coalesce(p_plan, mailroom.setting('http.anonymous_plan')), 'mcp', v_owner
    ) AS c;
    SELECT m.* INTO v_box FROM mailroom.mailboxes AS m WHERE m.id = v_created.mailbox_id;
    RETURN mailroom_internal._http_mailbox_json(v_box);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_create_mailbox(bytea, integer, text) IS
'MCP create_inbox: create_mailbox owned by (mcp, the API key''s owner), plan p_plan or http.anonymous_plan, within the REST creation rate limit (MR243); the mailbox as JSON (as http_get_mailbox).';

GRANT EXECUTE ON FUNCTION mailroom.mcp_create_mailbox(bytea, integer, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_list_mailboxes(p_key_digest bytea, p_limit integer DEFAULT 100)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owner text := mailroom_internal._mcp_owner(p_key_digest);
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 500 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'limit must be between 1 and 500';
    END IF;
    -- the open inboxes of the key's owner (api and mcp), newest first
    RETURN (
        SELECT coalesce(jsonb_agg(mailroom_internal._http_mailbox_json(b) ORDER BY b.created_at DESC, b.id DESC), '[]')
        FROM (
            SELECT m.*
            FROM mailroom.mailboxes AS m
            WHERE m.owner_type IN ('api', 'mcp')
                AND m.owner_id = v_owner
                AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, mailroom.clock())
            ORDER BY m.created_at DESC, m.id DESC
            LIMIT p_limit
        ) AS b
    );
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_list_mailboxes(bytea, integer) IS
'MCP list_inboxes: the open api and mcp inboxes of the API key''s owner, newest first, as a JSON array (at most p_limit, 1 to 500).';

GRANT EXECUTE ON FUNCTION mailroom.mcp_list_mailboxes(bytea, integer) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_list_messages(
    p_address text,
    p_key_digest bytea,
    p_limit integer DEFAULT 20,
    p_offset integer DEFAULT 0
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes;
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 500 OR p_offset IS NULL OR p_offset < 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'limit must be between 1 and 500 and offset non-negative';
    END IF;
    v_box := mailroom_internal._mcp_box(p_address, p_key_digest);
    RETURN jsonb_build_object(
        'mailbox', mailroom_internal._http_mailbox_json(v_box),
        'messages', (
            SELECT coalesce(jsonb_agg(mailroom_internal._http_message_summary(g) ORDER BY g.received_at DESC, g.id DESC), '[]')
            FROM (
                SELECT g.*
                FROM mailroom.messages AS g
                WHERE g.mailbox_id = v_box.id
                ORDER BY g.received_at DESC, g.id DESC
                LIMIT p_limit OFFSET p_offset
            ) AS g
        ),
        'limit', p_limit,
        'offset', p_offset
    );
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_list_messages(text, bytea, integer, integer) IS
'MCP list_messages and the inbox resource: the inbox and a page of its message summaries, newest first, as JSON (as http_list_messages).';

GRANT EXECUTE ON FUNCTION mailroom.mcp_list_messages(text, bytea, integer, integer) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_read_message(p_address text, p_key_digest bytea, p_message_id bigint)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, NULL, mailroom_internal._mcp_key(p_key_digest));
    v_row mailroom.messages := mailroom_internal._read_message_row(
        p_address, NULL, p_message_id, v_who.owner_type, v_who.owner_id
    );
BEGIN
    -- the HTTP API's Message (reply_to, from_address, body_text …), and the keys MCP answered first
    RETURN mailroom_internal._http_message_document(v_row)
        || jsonb_build_object('to', v_row.envelope_to, 'text', v_row.text_body, 'html', v_row.html_body);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_read_message(text, bytea, bigint) IS
'MCP read_message and the message resource: the message read once and marked read, as http_read_message answers it (REST v1 Message: reply_to, headers, bodies, attachments'' metadata, the extracted link and code) with MCP''s first keys to, text and html.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_read_message(text, bytea, bigint) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_check_message(
    p_address text,
    p_key_digest bytea,
    p_subject_like text DEFAULT null,
    p_last boolean DEFAULT false
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes := mailroom_internal._mcp_box(p_address, p_key_digest);
    v_found mailroom.messages := mailroom_internal._newest_message(v_box.id, p_subject_like);
BEGIN
    -- one look, no wait (the server waits between looks on its LISTEN, holding no connection); the
    -- inbox's id comes with it, the key the server's fan-out wakes waiters by
    IF v_found.id IS NULL AND p_last THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR212',
            MESSAGE = 'no matching message arrived in time';
    END IF;
    RETURN jsonb_build_object(
        'mailbox_id', v_box.id,
        'message', CASE WHEN v_found.id IS NOT NULL THEN jsonb_build_object(
            'id', v_found.id,
            'received_at', v_found.received_at,
            'subject', v_found.subject,
            'from', v_found.from_header,
            'envelope_from', v_found.envelope_from
        ) END
    );
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_check_message(text, bytea, text, boolean) IS
'MCP wait_for_message: one look without waiting: the inbox id and its newest message whose subject is LIKE p_subject_like (null when none yet); p_last (the wait''s last look): MR212 when none.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_check_message(text, bytea, text, boolean) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_extract_link(
    p_address text,
    p_key_digest bytea,
    p_message_id bigint,
    p_url_like text DEFAULT null
)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, NULL, mailroom_internal._mcp_key(p_key_digest));
BEGIN
    RETURN mailroom.extract_link(p_address, NULL, p_message_id, p_url_like, v_who.owner_type, v_who.owner_id);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_extract_link(text, bytea, bigint, text) IS
'MCP extract_link: extract_link for the API key''s owner (the first http(s) link LIKE p_url_like; MR215 when none).';

GRANT EXECUTE ON FUNCTION mailroom.mcp_extract_link(text, bytea, bigint, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_extract_code(
    p_address text,
    p_key_digest bytea,
    p_message_id bigint,
    p_pattern text DEFAULT null
)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, NULL, mailroom_internal._mcp_key(p_key_digest));
    v_owner text := v_who.owner_id;
    v_type text := v_who.owner_type;
BEGIN
    IF p_pattern IS NULL THEN
        RETURN mailroom.extract_code(p_address, NULL, p_message_id, p_owner_type => v_type, p_owner_id => v_owner);
    END IF;
    RETURN mailroom.extract_code(p_address, NULL, p_message_id, p_pattern, v_type, v_owner);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_extract_code(text, bytea, bigint, text) IS
'MCP extract_code: extract_code for the API key''s owner (p_pattern NULL: a 5-digit word; MR215 when none).';

GRANT EXECUTE ON FUNCTION mailroom.mcp_extract_code(text, bytea, bigint, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_delete_mailbox(p_address text, p_key_digest bytea)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, NULL, mailroom_internal._mcp_key(p_key_digest));
BEGIN
    RETURN mailroom.delete_mailbox(p_address, NULL, v_who.owner_type, v_who.owner_id);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_delete_mailbox(text, bytea) IS
'MCP delete_inbox: delete_mailbox for the API key''s owner (soft delete: it refuses mail at once); false if it was deleted already.';

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
    RETURN mailroom_internal._http_message_summary(
        mailroom_internal._mark_message(mailroom_internal._mcp_box(p_address, p_key_digest), p_message_id, p_is_read, p_tags)
    );
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_mark_message(text, bytea, bigint, boolean, text[]) IS
'MCP mark_message: mark a message read or unread and/or replace its tags (NULL: unchanged), for the API key''s owner; the message summary after (as PATCH over REST).';

GRANT EXECUTE ON FUNCTION mailroom.mcp_mark_message(text, bytea, bigint, boolean, text[]) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_clear_messages(p_address text, p_key_digest bytea)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN jsonb_build_object(
        'deleted', mailroom_internal._delete_inbox_messages(mailroom_internal._mcp_box(p_address, p_key_digest), NULL, true)
    );
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_clear_messages(text, bytea) IS
'MCP clear_inbox: delete every message of an open inbox of the API key''s owner (the inbox stays); {"deleted": n}.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_clear_messages(text, bytea) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_extend_mailbox(p_address text, p_key_digest bytea, p_ttl_seconds integer)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the rule of POST …/extend (sql/29_http.sql): the key's digest authorizes it as there
    PERFORM mailroom_internal._mcp_box(p_address, p_key_digest);
    RETURN mailroom.http_extend_mailbox(p_address, NULL, p_key_digest, p_ttl_seconds);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_extend_mailbox(text, bytea, integer) IS
'MCP extend_inbox: expires_at = now + p_ttl_seconds, clamped to the plan''s max TTL, never earlier (as POST …/extend); the inbox after.';

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
DECLARE
    v_who record := mailroom_internal._http_who(p_address, NULL, mailroom_internal._mcp_key(p_key_digest));
BEGIN
    RETURN mailroom.set_inbox_fault(
        p_address, NULL, p_stage, p_reply, coalesce(p_share, 100), p_count, v_who.owner_type, v_who.owner_id
    );
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_set_inbox_fault(text, bytea, text, text, numeric, integer) IS
'MCP set_inbox_fault: set_inbox_fault for the API key''s owner (stage, reply, share, the next p_count only); the fault as JSON.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_set_inbox_fault(text, bytea, text, text, numeric, integer) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.mcp_clear_inbox_fault(p_address text, p_key_digest bytea)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, NULL, mailroom_internal._mcp_key(p_key_digest));
BEGIN
    RETURN mailroom.clear_inbox_fault(p_address, NULL, v_who.owner_type, v_who.owner_id);
END;
$$;

COMMENT ON FUNCTION mailroom.mcp_clear_inbox_fault(text, bytea) IS
'MCP clear_inbox_fault: clear_inbox_fault for the API key''s owner (the inbox''s own fault); false if it had none.';

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
'The MR codes each mcp_* function may raise (function * : every one), in the order a tool description names them, with their meaning.';

GRANT EXECUTE ON FUNCTION mailroom.mcp_error_codes() TO mailroom_http;
