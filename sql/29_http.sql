-- The HTTP API of `mailroom http serve` (docs/http.md): one function per request, each answering a
-- JSON document (or the raw bytes), authorized here: by the inbox's session token, or by an API
-- key's sha256 digest (the key itself never reaches the database), whose owner owns the inbox
-- (owner type api, or mcp: an agent's inbox is its owner's over REST too). Each is a thin wrapper of the SQL API the CLI and psql use (create_mailbox,
-- list_messages' authorization, read_message, delete_mailbox, extract_link, extract_code,
-- wait_for_message, search_messages), so the HTTP answer and the psql answer are the same rule.
-- The shapes are the REST v1 contract (docs/architecture.md, "REST v1 contract"; the pydantic
-- models of driver/mailroom/http/models.py document them): an inbox is _http_mailbox_json, a
-- message in a list _http_message_summary, a message read _http_message_summary's keys and its
-- bodies; the original expiring-inbox service's field names (from_address, body_text, body_html,
-- is_read, a JSON array for a list), mailroom's richer fields as extra keys.
-- Errors: those of the wrapped functions (MR201-MR215, MR246), and MR240 no credentials,
-- MR241 unknown or revoked API key (sql/28), MR242 a plan that needs an API key, MR243 creation
-- rate limit (DETAIL: the seconds until the window ends).

CREATE OR REPLACE FUNCTION mailroom_internal._http_owner(p_session_token text, p_key_digest bytea)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the API key's owner (NULL when the caller holds a session token instead); MR240 with neither
    IF p_session_token IS NULL AND p_key_digest IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR240',
            MESSAGE = 'credentials required: the inbox''s session token or an API key';
    END IF;
    RETURN mailroom_internal._api_key_owner(p_key_digest);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._http_owner(text, bytea) IS
'Internal: the owner id of the request''s API key (NULL with a session token); MR240 with no credentials, MR241 for a bad key.';

CREATE OR REPLACE FUNCTION mailroom_internal._http_who(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    OUT owner_type text,
    OUT owner_id text
)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    -- THE owner rule of the front ends (issue 36: the HTTP face's http_* and the MCP server's mcp_*
    -- functions both use it, through _http_box or directly; the MCP face passes no session token
    -- and checks first that there is a key, _mcp_key, for its own MR240 wording). The owner a
    -- request reads as: an API key's owner holds its inboxes of owner type api and mcp (an agent's
    -- inbox, made over MCP or by `mailroom inbox create --owner-type mcp`), any other inbox is read
    -- as api and so refused (MR204); with a session token the owner is NULL and the token decides
    owner_id := mailroom_internal._http_owner(p_session_token, p_key_digest);
    owner_type := 'api';
    IF owner_id IS NOT NULL THEN
        -- by id, found by address (one single-shard read on Citus, as _authorize_mailbox)
        v_id := mailroom_internal._mailbox_id(mailroom_internal._normalize_address(p_address));
        IF EXISTS (SELECT 1 FROM mailroom.mailboxes AS m WHERE m.id = v_id AND m.owner_type = 'mcp') THEN
            owner_type := 'mcp';
        END IF;
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._http_who(text, text, bytea) IS
'Internal: the one owner rule of the HTTP and MCP faces: the (owner type, owner id) a request reads an inbox as: an API key''s owner as api, or as mcp for its mcp inboxes; MR240/MR241 as _http_owner.';

CREATE OR REPLACE FUNCTION mailroom_internal._http_box(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_require_open boolean DEFAULT true
)
RETURNS mailroom.mailboxes
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
BEGIN
    -- a NULL owner matches nothing: the session token decides then
    RETURN mailroom_internal._authorize_mailbox(p_address, p_session_token, v_who.owner_type, v_who.owner_id, p_require_open);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._http_box(text, text, bytea, boolean) IS
'Internal: the mailbox a request may use (session token, or an API key whose owner owns it as api or mcp), open unless p_require_open is false.';

CREATE OR REPLACE FUNCTION mailroom_internal._http_mailbox_json(p_box mailroom.mailboxes)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT jsonb_build_object(
        'address', p_box.address,
        'plan', p_box.plan,
        'owner_type', p_box.owner_type,
        'created_at', p_box.created_at,
        'expires_at', p_box.expires_at,
        'message_count', p_box.message_count,
        'catchall', p_box.catchall_domain IS NOT NULL,
        'max_messages', p.max_messages,
        'max_message_bytes', p.max_message_bytes,
        'max_ttl_seconds', p.max_ttl_minutes::bigint * 60,
        'mailbox_id', p_box.id,
        'is_active', mailroom_internal._mailbox_open(p_box),
        -- the fault injected at its SMTP door (sql/24_faults.sql), its own or its catch-all
        -- domain's; null when none
        'fault', mailroom_internal._fault_json(p_box.id, p_box.address, split_part(p_box.address, '@', 2))
    )
    FROM mailroom.plans AS p
    WHERE p.name = p_box.plan);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._http_mailbox_json(mailroom.mailboxes) IS
'Internal: the JSON of a mailbox in HTTP and MCP answers, REST v1 Mailbox (no token, no owner id; its fault or null; max_ttl_seconds: the plan''s longest TTL from now, the bound of http_extend_mailbox).';

CREATE OR REPLACE FUNCTION mailroom_internal._http_client_subject(p_client text)
RETURNS bytea
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- a client address is kept only keyed with the redaction pepper (never readable back)
    SELECT mailroom_internal._hmac(convert_to('http-client:' || coalesce(p_client, ''), 'UTF8'), p.pepper, 'sha256')
    FROM mailroom.redaction_pepper AS p
$$;

COMMENT ON FUNCTION mailroom_internal._http_client_subject(text) IS
'Internal: the rate-limit subject of a client address (HMAC under the redaction pepper).';

CREATE OR REPLACE FUNCTION mailroom_internal._http_rate_take(p_subject bytea)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_window interval := mailroom.setting('http.create_window')::interval;
    v_limit integer := mailroom.setting('http.create_limit')::integer;
    v_over timestamptz;
    v_used integer;
    v_start timestamptz;
BEGIN
    -- a fixed window per subject; the refusal rolls its own count back, so it stays at the limit.
    -- A window that started at or before v_now - v_window is over (compared so, the SET has only
    -- immutable operators: Citus refuses timestamptz + interval, which is stable, there)
    v_over := v_now - v_window;
    INSERT INTO mailroom.http_rate_limits AS r (subject, window_start, used)
    VALUES (p_subject, v_now, 1)
    ON CONFLICT (subject) DO UPDATE
    SET
        used = CASE WHEN r.window_start <= v_over THEN 1 ELSE r.used + 1 END,
        window_start = CASE WHEN r.window_start <= v_over THEN v_now ELSE r.window_start END
    RETURNING r.used, r.window_start INTO v_used, v_start;
    IF v_used > v_limit THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR243',
            MESSAGE = format('too many mailboxes created: %s per %s', v_limit, v_window),
            DETAIL = greatest(1, ceil(extract(EPOCH FROM v_start + v_window - v_now)))::bigint::text;
    END IF;
    -- a few windows long past go with each creation, so the table stays the size of the traffic
    DELETE FROM mailroom.http_rate_limits AS r
    WHERE r.subject IN (
        SELECT o.subject FROM mailroom.http_rate_limits AS o
        WHERE o.window_start < v_now - v_window - interval '1 hour'
        LIMIT 10
        FOR UPDATE SKIP LOCKED
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._http_rate_take(bytea) IS
'Internal: count one creation for a subject; MR243 (DETAIL: seconds to wait) past http.create_limit per http.create_window.';

CREATE OR REPLACE FUNCTION mailroom.http_create_mailbox(
    p_key_digest bytea,
    p_client text,
    p_ttl_minutes integer DEFAULT null,
    p_plan text DEFAULT null,
    p_face text DEFAULT 'rest'
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- MCP knows only API keys (MR240 without one, _mcp_key); its inboxes are owner type mcp
    v_owner text := mailroom_internal._api_key_owner(
        CASE WHEN p_face = 'mcp' THEN mailroom_internal._mcp_key(p_key_digest) ELSE p_key_digest END
    );
    v_anonymous_plan text := mailroom.setting('http.anonymous_plan');
    v_plan text := coalesce(p_plan, v_anonymous_plan);
    v_created record;
    v_box mailroom.mailboxes;
BEGIN
    IF v_owner IS NULL AND v_plan IS DISTINCT FROM v_anonymous_plan THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR242',
            MESSAGE = format('plan %s needs an API key (anonymous inboxes get plan %s)', left(v_plan, 63), v_anonymous_plan);
    END IF;
    PERFORM mailroom_internal._http_rate_take(coalesce(p_key_digest, mailroom_internal._http_client_subject(p_client)));
    SELECT c.mailbox_id, c.session_token INTO v_created
    FROM mailroom.create_mailbox(
        p_ttl_minutes, v_plan,
        CASE WHEN v_owner IS NULL THEN 'anonymous' WHEN p_face = 'mcp' THEN 'mcp' ELSE 'api' END, v_owner
    ) AS c;
    SELECT m.* INTO v_box FROM mailroom.mailboxes AS m WHERE m.id = v_created.mailbox_id;
    -- the session token exists only in this answer (the table keeps its digest)
    RETURN mailroom_internal._http_mailbox_json(v_box) || jsonb_build_object('session_token', v_created.session_token);
END;
$$;

COMMENT ON FUNCTION mailroom.http_create_mailbox(bytea, text, integer, text, text) IS
'POST /api/v1/mailboxes and MCP create_inbox (operation create_mailbox): create_mailbox for an API key''s owner (any plan; owner type mcp when p_face is mcp, which needs a key: MR240) or anonymously (plan http.anonymous_plan, MR242 otherwise), within the creation rate limit of the key or the client (MR243); the mailbox as JSON with its session token. Errors: MR201, MR202, MR242, MR243, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_create_mailbox(bytea, text, integer, text, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_get_mailbox(p_address text, p_session_token text, p_key_digest bytea)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom_internal._http_mailbox_json(mailroom_internal._http_box(p_address, p_session_token, p_key_digest));
END;
$$;

COMMENT ON FUNCTION mailroom.http_get_mailbox(text, text, bytea) IS
'GET /api/v1/mailboxes/{address}: an open mailbox as JSON (MR203-MR206 as for reading, MR240/MR241 credentials). Errors: MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_get_mailbox(text, text, bytea) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_list_mailboxes(
    p_key_digest bytea,
    p_limit integer DEFAULT 100,
    p_offset integer DEFAULT 0,
    p_sink boolean DEFAULT false
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owner text;
    v_now timestamptz := mailroom.clock();
    v_box mailroom.mailboxes;
    v_list jsonb := '[]';
BEGIN
    -- an inbox list belongs to an owner: only an API key has one (a session token opens one inbox,
    -- and is refused here as an unknown key, MR241, as by http_create_mailbox); MR240 without any,
    -- but for the sink's open listing (p_sink: the face's --sink on a loopback bind or with
    -- --sink-public, docs/inboxes.md): the sink's open inboxes, newest first, no key needed
    IF p_key_digest IS NULL AND NOT coalesce(p_sink, false) THEN
        PERFORM mailroom_internal._http_owner(NULL, NULL);
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 500 OR p_offset IS NULL OR p_offset < 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'limit must be between 1 and 500 and offset non-negative';
    END IF;
    IF p_key_digest IS NULL THEN
        FOR v_box IN
            SELECT m.*
            FROM mailroom.mailboxes AS m
            WHERE
                m.catchall_domain = '*' AND m.is_active
                AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, v_now)
            ORDER BY m.created_at DESC, m.id DESC
            LIMIT p_limit OFFSET p_offset
        LOOP
            -- each with its session token (CreatedMailbox's key), so the page opens it as any anonymous inbox
            v_list := v_list || jsonb_build_array(
                mailroom_internal._http_mailbox_json(v_box)
                || jsonb_build_object('session_token', mailroom_internal._sink_token(v_box.address))
            );
        END LOOP;
        RETURN v_list;
    END IF;
    v_owner := mailroom_internal._api_key_owner(p_key_digest);
    -- the owner's open inboxes of owner type api and mcp (mailboxes_owner_idx), newest first: the
    -- rows by one read of plain columns (on Citus one multi-shard SELECT), each one's JSON built here
    FOR v_box IN
        SELECT m.*
        FROM mailroom.mailboxes AS m
        WHERE
            m.owner_type IN ('api', 'mcp')
            AND m.owner_id = v_owner
            AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, v_now)
        ORDER BY m.created_at DESC, m.id DESC
        LIMIT p_limit OFFSET p_offset
    LOOP
        v_list := v_list || jsonb_build_array(mailroom_internal._http_mailbox_json(v_box));
    END LOOP;
    RETURN v_list;
END;
$$;

COMMENT ON FUNCTION mailroom.http_list_mailboxes(bytea, integer, integer, boolean) IS
'GET /api/v1/mailboxes (and MCP''s inbox list): the open inboxes of an API key''s owner, owner types api and mcp, newest first, as a JSON array of _http_mailbox_json; without a key and with p_sink (the face''s sink listing), the sink''s open inboxes, each with its session_token (MR240 no key, MR241 unknown key or a session token). Errors: MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_list_mailboxes(bytea, integer, integer, boolean) TO mailroom_http;

-- The three helpers below build every message answer, once per message of a list: they are inlined
-- into the query of their caller (an API function, whose SET search_path = pg_catalog, pg_temp is the
-- path they are parsed under), so they carry no SET of their own, which would stop the planner from
-- inlining them (a page of 20 messages: 1.7 -> 0.7 ms of SQL; docs/benchmarks.md, issue 46). Nobody
-- but the owner may execute them (tests/pgtap/05_privileges.sql), and 29_http.sql checks they inline.
CREATE OR REPLACE FUNCTION mailroom_internal._from_address(p_from_header text, p_envelope_from text)
RETURNS text
LANGUAGE sql
IMMUTABLE
AS $$
    -- the address of a From header (inside <…> when there is one, else its first word with an @),
    -- else the envelope sender (NULL for a bounce's empty reverse path)
    SELECT coalesce(
        substring(p_from_header FROM '<([^<>[:space:]]+@[^<>[:space:]]+)>'),
        substring(p_from_header FROM '([^<>[:space:]",;:()]+@[^<>[:space:]",;:()]+)'),
        nullif(p_envelope_from, '')
    )
$$;

COMMENT ON FUNCTION mailroom_internal._from_address(text, text) IS
'Internal (inlined): the sender''s address of a message for from_address: the From header''s address, else the envelope sender.';

CREATE OR REPLACE FUNCTION mailroom_internal._http_message_json(p_message mailroom.messages)
RETURNS jsonb
LANGUAGE sql
STABLE  -- not IMMUTABLE: received_at's text follows the session's TimeZone
AS $$
    SELECT jsonb_build_object(
        -- the original service's keys
        'id', p_message.id,
        'subject', p_message.subject,
        'from_address', mailroom_internal._from_address(p_message.from_header, p_message.envelope_from),
        'to_address', p_message.envelope_to,
        'received_at', p_message.received_at,
        'is_read', p_message.is_read,
        'has_attachments', jsonb_array_length(p_message.attachments) > 0,
        -- mailroom's
        'from', p_message.from_header,
        'envelope_from', p_message.envelope_from,
        'size', p_message.size_bytes,
        'attachment_count', jsonb_array_length(p_message.attachments),
        'reply_to', p_message.reply_to
    )
$$;

COMMENT ON FUNCTION mailroom_internal._http_message_json(mailroom.messages) IS
'Internal (inlined): the keys every message answer of the HTTP API has (REST v1 MessageSummary without its snippet), from the stored row.';

CREATE OR REPLACE FUNCTION mailroom_internal._http_message_summary(p_message mailroom.messages)
RETURNS jsonb
LANGUAGE sql
STABLE  -- not IMMUTABLE: received_at's text follows the session's TimeZone
AS $$
    SELECT mailroom_internal._http_message_json(p_message) || jsonb_build_object(
        'snippet', btrim(regexp_replace(left(coalesce(p_message.text_body, ''), 400), '\s+', ' ', 'g')),
        'tags', to_jsonb(p_message.tags)
    )
$$;

COMMENT ON FUNCTION mailroom_internal._http_message_summary(mailroom.messages) IS
'Internal (inlined): the JSON of a message in a list, REST v1 MessageSummary (no bodies: the first words of the text as snippet; its tags).';

CREATE OR REPLACE FUNCTION mailroom_internal._http_message_page(
    p_box mailroom.mailboxes,
    p_limit integer,
    p_offset integer,
    p_after_id bigint,
    p_tag text DEFAULT null,
    p_unread boolean DEFAULT null,
    p_before_id bigint DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 500 OR p_offset IS NULL OR p_offset < 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'limit must be between 1 and 500 and offset non-negative';
    END IF;
    -- newest first by id: per mailbox, ids follow commit order (deliver_message takes the mailbox's
    -- row lock before it takes an id), where received_at is read before that lock is waited for, so
    -- two deliveries can carry it in the other order; drop_oldest lets go by id too. So both cursors
    -- are ids: after_id, only those delivered after that one; before_id (keyset paging), only those
    -- before it, whether or not it is still there.
    RETURN (
        SELECT coalesce(jsonb_agg(mailroom_internal._http_message_summary(g) ORDER BY g.id DESC), '[]')
        FROM (
            SELECT g.*
            FROM (
                SELECT g.*
                FROM mailroom.messages AS g
                WHERE
                    g.mailbox_id = p_box.id AND (p_after_id IS NULL OR g.id > p_after_id)
                    AND (p_before_id IS NULL OR g.id < p_before_id)
                    -- the filters: a tag (as stored: lower case), unread (true) or read (false) only
                    AND (p_tag IS NULL OR lower(btrim(p_tag)) = ANY(g.tags))
                    AND (p_unread IS NULL OR g.is_read <> p_unread)
                -- the inbox's rows through (mailbox_id, received_at), at most its plan's count, then
                -- sorted: never the primary key's id order with a filter, which walks the newer mail
                -- of every other inbox to find this one's (an old inbox: its whole table's tail)
                OFFSET 0
            ) AS g
            ORDER BY g.id DESC
            LIMIT p_limit OFFSET p_offset
        ) AS g
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._http_message_page(mailroom.mailboxes, integer, integer, bigint, text, boolean, bigint) IS
'Internal: a page of a mailbox''s messages, newest first by id (after p_after_id, before p_before_id if given; with tag p_tag; unread or read only by p_unread), as a JSON array of MessageSummary; 22023 for a limit out of 1..500 or a negative offset.';

CREATE OR REPLACE FUNCTION mailroom.http_list_messages(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_limit integer DEFAULT 50,
    p_offset integer DEFAULT 0,
    p_after_id bigint DEFAULT null,
    p_tag text DEFAULT null,
    p_unread boolean DEFAULT null,
    p_before_id bigint DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom_internal._http_message_page(
        mailroom_internal._http_box(p_address, p_session_token, p_key_digest),
        p_limit, p_offset, p_after_id, p_tag, p_unread, p_before_id
    );
END;
$$;

COMMENT ON FUNCTION mailroom.http_list_messages(text, text, bytea, integer, integer, bigint, text, boolean, bigint) IS
'GET /api/v1/mailboxes/{address}/messages: a page of the mailbox''s messages, newest first by id (?limit=&offset=; after p_after_id, before p_before_id (keyset) if given; ?tag=, ?unread=), as a JSON array of MessageSummary. Errors: MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_list_messages(text, text, bytea, integer, integer, bigint, text, boolean, bigint)
TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_mailbox_view(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_limit integer DEFAULT 50,
    p_offset integer DEFAULT 0,
    p_after_id bigint DEFAULT null,
    p_before_id bigint DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes := mailroom_internal._http_box(p_address, p_session_token, p_key_digest);
BEGIN
    RETURN jsonb_build_object(
        'mailbox', mailroom_internal._http_mailbox_json(v_box),
        'messages', mailroom_internal._http_message_page(
            v_box, p_limit, p_offset, p_after_id, p_before_id => p_before_id
        )
    );
END;
$$;

COMMENT ON FUNCTION mailroom.http_mailbox_view(text, text, bytea, integer, integer, bigint, bigint) IS
'The inbox page and the start of GET …/events: the mailbox and a page of its messages (newest first by id; before p_before_id: the keyset page of the page''s Older link) in one call, {"mailbox": Mailbox, "messages": [MessageSummary]}.';

GRANT EXECUTE ON FUNCTION mailroom.http_mailbox_view(text, text, bytea, integer, integer, bigint, bigint) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom_internal._header_fields(p_raw bytea)
RETURNS jsonb
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- the header section: up to the first empty line, at most 64 KiB (bytes past it are left out)
    v_head bytea := substring(p_raw FROM 1 FOR 65536);
    v_end integer := position('\x0d0a0d0a'::bytea IN v_head);
    v_text text;
BEGIN
    IF v_end = 0 THEN
        v_end := position('\x0a0a'::bytea IN v_head);
    END IF;
    IF v_end > 0 THEN
        v_head := substring(v_head FROM 1 FOR v_end - 1);
    END IF;
    -- bytes outside ASCII stay visible as \ooo escapes (a header is ASCII unless it is broken)
    v_text := replace(encode(v_head, 'escape'), chr(13), '');
    -- one field a line after unfolding: [name, value] pairs in order, at most 500
    RETURN coalesce((
        SELECT jsonb_agg(jsonb_build_array(btrim(split_part(f.line, ':', 1)), btrim(substr(f.line, strpos(f.line, ':') + 1)))
                         ORDER BY f.n)
        FROM regexp_split_to_table(regexp_replace(v_text, E'\n[ \t]+', ' ', 'g'), E'\n') WITH ORDINALITY AS f (line, n)
        WHERE strpos(f.line, ':') > 1 AND f.n <= 500
    ), '[]');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._header_fields(bytea) IS
'Internal: the header fields of a raw message as [name, value] pairs, unfolded (first 64 KiB, 500 fields, non-ASCII bytes escaped).';

CREATE OR REPLACE FUNCTION mailroom_internal._http_message_document(p_message mailroom.messages)
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailroom_internal._http_message_json(p_message) || jsonb_build_object(
        'body_text', p_message.text_body,
        'body_html', p_message.html_body,
        'attachments', (
            SELECT coalesce(jsonb_agg(a.value || jsonb_build_object('index', a.n - 1) ORDER BY a.n), '[]')
            FROM jsonb_array_elements(p_message.attachments) WITH ORDINALITY AS a (value, n)
        ),
        'headers', mailroom_internal._header_fields(p_message.raw),
        -- the first link and the first code (extract_code's default pattern), NULL when none
        'link', mailroom_internal._message_link(p_message, NULL),
        'code', (mailroom_internal._message_code(p_message, '\m\d{5}\M'))[1],
        'tags', to_jsonb(coalesce(p_message.tags, '{}'))
    )
$$;

COMMENT ON FUNCTION mailroom_internal._http_message_document(mailroom.messages) IS
'Internal: the JSON of one message read whole, REST v1 Message (bodies, attachments'' metadata, headers, its first link and code found in it), from the stored row: http_read_message''s and mcp_read_message''s.';

CREATE OR REPLACE FUNCTION mailroom.http_read_message(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_message_id bigint
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
    -- the row read once, authorized and marked read (its document finds its link and code)
    v_row mailroom.messages := mailroom_internal._read_message_row(
        p_address, p_session_token, p_message_id, v_who.owner_type, v_who.owner_id
    );
BEGIN
    RETURN mailroom_internal._http_message_document(v_row);
END;
$$;

COMMENT ON FUNCTION mailroom.http_read_message(text, text, bytea, bigint) IS
'GET /api/v1/mailboxes/{address}/messages/{id}: read_message as JSON, REST v1 Message (body_text, body_html, attachments'' metadata, headers, the extracted link and code), marked read. Errors: MR209, MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_read_message(text, text, bytea, bigint) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_message_raw(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_message_id bigint
)
RETURNS bytea
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
BEGIN
    RETURN (mailroom_internal._readable_message(p_address, p_session_token, p_message_id, v_who.owner_type, v_who.owner_id)).raw;
END;
$$;

COMMENT ON FUNCTION mailroom.http_message_raw(text, text, bytea, bigint) IS
'GET …/messages/{id}/raw and …/attachments/{n}: the raw bytes of a message as received (MR209 if not in this mailbox).';

GRANT EXECUTE ON FUNCTION mailroom.http_message_raw(text, text, bytea, bigint) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_delete_mailbox(p_address text, p_session_token text, p_key_digest bytea)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
BEGIN
    RETURN mailroom.delete_mailbox(p_address, p_session_token, v_who.owner_type, v_who.owner_id);
END;
$$;

COMMENT ON FUNCTION mailroom.http_delete_mailbox(text, text, bytea) IS
'DELETE /api/v1/mailboxes/{address}: delete_mailbox (soft delete: it refuses mail at once); false if it was deleted already. Errors: MR203, MR204, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_delete_mailbox(text, text, bytea) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_delete_message(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_message_id bigint
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes := mailroom_internal._http_box(p_address, p_session_token, p_key_digest);
    v_bytes bigint;
BEGIN
    DELETE FROM mailroom.messages AS g WHERE g.id = p_message_id AND g.mailbox_id = v_box.id
    RETURNING g.size_bytes INTO v_bytes;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR209',
            MESSAGE = format('message %s not found in this mailbox', coalesce(p_message_id::text, 'NULL'));
    END IF;
    -- a deleted message frees its place under the plan's message count
    UPDATE mailroom.mailboxes AS m
    SET message_count = greatest(m.message_count - 1, 0), stored_bytes = greatest(m.stored_bytes - v_bytes, 0)
    WHERE m.id = v_box.id;
END;
$$;

COMMENT ON FUNCTION mailroom.http_delete_message(text, text, bytea, bigint) IS
'DELETE /api/v1/mailboxes/{address}/messages/{id}: delete one message of an open mailbox (it frees a place under the plan''s count); MR209 if not in it. Errors: MR209, MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_delete_message(text, text, bytea, bigint) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_extract_link(
    p_address text,
    p_session_token text,
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
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
BEGIN
    RETURN mailroom.extract_link(p_address, p_session_token, p_message_id, p_url_like, v_who.owner_type, v_who.owner_id);
END;
$$;

COMMENT ON FUNCTION mailroom.http_extract_link(text, text, bytea, bigint, text) IS
'GET …/messages/{id}/links: extract_link (the first http(s) link LIKE p_url_like; MR215 when none). Errors: MR215, MR011, MR209, MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_extract_link(text, text, bytea, bigint, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_extract_code(
    p_address text,
    p_session_token text,
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
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
BEGIN
    IF p_pattern IS NULL THEN
        RETURN mailroom.extract_code(
            p_address, p_session_token, p_message_id, p_owner_type => v_who.owner_type, p_owner_id => v_who.owner_id
        );
    END IF;
    RETURN mailroom.extract_code(p_address, p_session_token, p_message_id, p_pattern, v_who.owner_type, v_who.owner_id);
END;
$$;

COMMENT ON FUNCTION mailroom.http_extract_code(text, text, bytea, bigint, text) IS
'GET …/messages/{id}/code: extract_code (p_pattern NULL: its default, a 5-digit word; MR215 when none). Errors: MR215, MR010, MR034, MR209, MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_extract_code(text, text, bytea, bigint, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_wait_look(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_subject_like text DEFAULT null,
    p_after_id bigint DEFAULT null,
    p_last boolean DEFAULT false
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
    v_box mailroom.mailboxes;
    v_found mailroom.messages;
BEGIN
    -- One look of the one wait (docs/architecture.md, "The wait": REST's long poll and MCP's
    -- wait_for_message): wait_for_message's rule (its authorization, _newest_message) without
    -- waiting; the server waits between looks on its LISTEN, holding no connection. The inbox's id
    -- is the key its fan-out wakes waiters by; expires_in (seconds, by mailroom.clock()) how long it
    -- may sleep at most: a look after that answers MR205.
    PERFORM mailroom_internal._caller_pattern(p_subject_like, 'like');
    v_box := mailroom_internal._authorize_mailbox(p_address, p_session_token, v_who.owner_type, v_who.owner_id);
    v_found := mailroom_internal._newest_message(v_box.id, p_subject_like, p_after_id);
    IF v_found.id IS NULL AND p_last THEN
        RAISE EXCEPTION USING  -- the wait's last look: nothing arrived in time
            ERRCODE = 'MR212',
            MESSAGE = 'no matching message arrived within the wait''s timeout';
    END IF;
    RETURN jsonb_build_object(
        'mailbox_id', v_box.id,
        'expires_at', v_box.expires_at,
        'expires_in', greatest(extract(EPOCH FROM v_box.expires_at - mailroom.clock())::double precision, 0),
        'message', CASE WHEN v_found.id IS NOT NULL THEN mailroom_internal._http_message_summary(v_found) END
    );
END;
$$;

COMMENT ON FUNCTION mailroom.http_wait_look(text, text, bytea, text, bigint, boolean) IS
'GET …/wait and MCP wait_for_message: one look of wait_for_message without waiting: {mailbox_id, expires_at, expires_in (seconds left by mailroom.clock()), message}, message the newest whose subject is LIKE p_subject_like and whose id is greater than p_after_id (a MessageSummary; null when none yet). '
'p_last (the wait''s last look): MR212 when none. Errors: MR212, MR205, MR206, MR251, MR252, MR253, MR011, MR203, MR204, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_wait_look(text, text, bytea, text, bigint, boolean) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_check_message(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_subject_like text DEFAULT null,
    p_last boolean DEFAULT false
)
RETURNS jsonb
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT nullif(
        mailroom.http_wait_look(p_address, p_session_token, p_key_digest, p_subject_like, null, p_last) -> 'message',
        'null'::jsonb
    )
$$;

COMMENT ON FUNCTION mailroom.http_check_message(text, text, bytea, text, boolean) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.http_wait_look(…). GET …/wait of 0.1: one look, the newest message whose subject is LIKE p_subject_like as a MessageSummary, NULL when none yet; p_last: MR212 when none.';

GRANT EXECUTE ON FUNCTION mailroom.http_check_message(text, text, bytea, text, boolean) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_search_messages(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_query text,
    p_limit integer DEFAULT 50,
    p_before_id bigint DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes := mailroom_internal._http_box(p_address, p_session_token, p_key_digest);
    v_ids bigint[];
    v_ranks real[];
    v_messages jsonb;
BEGIN
    -- the matches in their order, then their rows by the inbox's id (a query on one inbox: on Citus one
    -- shard, as every read of an inbox; the rows are not joined to the search's result)
    SELECT coalesce(array_agg(s.message_id ORDER BY s.n), '{}'), coalesce(array_agg(s.rank ORDER BY s.n), '{}')
    INTO v_ids, v_ranks
    FROM mailroom_internal._search_mailboxes(ARRAY[v_box.id], p_query, p_limit, p_before_id) WITH ORDINALITY AS s (
        message_id, received_at, from_header, subject, rank, n
    );
    -- a statement of its own (on Citus pushed to the inbox's shard whole; the mailbox's JSON reads others)
    SELECT coalesce(jsonb_agg(
        mailroom_internal._http_message_summary(g)
        || jsonb_build_object('rank', v_ranks[array_position(v_ids, g.id)])
        ORDER BY array_position(v_ids, g.id)
    ), '[]')
    INTO v_messages
    FROM (
        SELECT g.* FROM mailroom.messages AS g WHERE g.mailbox_id = v_box.id AND g.id = ANY(v_ids)
    ) AS g;
    RETURN jsonb_build_object(
        'mailbox', mailroom_internal._http_mailbox_json(v_box), 'query', p_query, 'messages', v_messages
    );
END;
$$;

COMMENT ON FUNCTION mailroom.http_search_messages(text, text, bytea, text, integer, bigint) IS
'GET …/search?q=: the mailbox and the messages search_messages finds, best first then newest by id, as JSON; ?before_id= the last message of the previous page (keyset). Refusals: MR246 a query without a word, MR225-MR227 the query, MR218 the page''s last message is gone. Errors: MR246, MR218, MR225, MR226, MR227, MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_search_messages(text, text, bytea, text, integer, bigint) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_message_attachment(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_message_id bigint,
    p_index integer
)
RETURNS TABLE (raw bytea, attachment jsonb)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
    v_message mailroom.messages := mailroom_internal._readable_message(
        p_address, p_session_token, p_message_id, v_who.owner_type, v_who.owner_id
    );
BEGIN
    -- the metadata delivery recorded (its sha256 names the part) and the raw bytes it is cut from
    attachment := v_message.attachments -> p_index;
    IF p_index IS NULL OR p_index < 0 OR attachment IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR250',
            MESSAGE = format('message %s has no attachment %s', p_message_id, coalesce(p_index::text, 'NULL'));
    END IF;
    raw := v_message.raw;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.http_message_attachment(text, text, bytea, bigint, integer) IS
'GET …/messages/{id}/attachments/{n}: the metadata of attachment n (from 0) and the raw message it is in; MR250 if there is none.';

GRANT EXECUTE ON FUNCTION mailroom.http_message_attachment(text, text, bytea, bigint, integer) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_message_frame(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_message_id bigint
)
RETURNS TABLE (html_body text, inline_parts jsonb, raw bytea)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
    v_row mailroom.messages := mailroom_internal._read_message_row(
        p_address, p_session_token, p_message_id, v_who.owner_type, v_who.owner_id
    );
BEGIN
    html_body := v_row.html_body;
    inline_parts := mailroom_internal._inline_images(v_row.html_body, v_row.attachments);
    -- the raw message only when a part is to be cut from it
    raw := CASE WHEN jsonb_array_length(inline_parts) > 0 THEN v_row.raw END;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.http_message_frame(text, text, bytea, bigint) IS
'GET …/messages/{id}/html: the HTML part, the inline images its cid: references may show (_inline_images: image parts of at most 2 MiB each, 8 MiB in all) and, when there are any, the raw message they are cut from; marks it read as http_read_message. Errors: MR240, MR241, MR203-MR206 as http_read_message, MR209 not in this mailbox.';

GRANT EXECUTE ON FUNCTION mailroom.http_message_frame(text, text, bytea, bigint) TO mailroom_http;

-- Fault injection from the API (issue 35, item 5; sql/24_faults.sql has the rule): the inbox's
-- own fault, set, shown and cleared by whoever may read the inbox (the owner rule above)

CREATE OR REPLACE FUNCTION mailroom.http_update_message(
    p_address text,
    p_session_token text,
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
    RETURN mailroom_internal._http_message_summary(mailroom_internal._mark_message(
        mailroom_internal._http_box(p_address, p_session_token, p_key_digest), p_message_id, p_is_read, p_tags
    ));
END;
$$;

COMMENT ON FUNCTION mailroom.http_update_message(text, text, bytea, bigint, boolean, text[]) IS
'PATCH /api/v1/mailboxes/{address}/messages/{id}: mark read or unread and/or replace the tag set (NULL: unchanged); the MessageSummary after. Errors: MR260, MR261, MR209, MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_update_message(text, text, bytea, bigint, boolean, text[]) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_delete_messages(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_message_ids bigint[]
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN jsonb_build_object('deleted', mailroom_internal._delete_inbox_messages(
        mailroom_internal._http_box(p_address, p_session_token, p_key_digest), p_message_ids, false
    ));
END;
$$;

COMMENT ON FUNCTION mailroom.http_delete_messages(text, text, bytea, bigint[]) IS
'POST /api/v1/mailboxes/{address}/messages/delete: delete the messages of these ids (1-500, MR262; ids not in the inbox are not counted); {"deleted": n}. Errors: MR262, MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_delete_messages(text, text, bytea, bigint[]) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_clear_messages(p_address text, p_session_token text, p_key_digest bytea)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN jsonb_build_object('deleted', mailroom_internal._delete_inbox_messages(
        mailroom_internal._http_box(p_address, p_session_token, p_key_digest), NULL, true
    ));
END;
$$;

COMMENT ON FUNCTION mailroom.http_clear_messages(text, text, bytea) IS
'DELETE /api/v1/mailboxes/{address}/messages: delete every message of an open inbox (the inbox stays); {"deleted": n}. Errors: MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_clear_messages(text, text, bytea) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_mark_all_read(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_is_read boolean DEFAULT true
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes := mailroom_internal._http_box(p_address, p_session_token, p_key_digest);
    v_marked integer;
BEGIN
    IF p_is_read IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'is_read must be true or false';
    END IF;
    -- every message of the inbox not marked so yet (an inbox holds at most its plan's max_messages)
    UPDATE mailroom.messages AS g
    SET is_read = p_is_read
    WHERE g.mailbox_id = v_box.id AND g.is_read IS DISTINCT FROM p_is_read;
    GET DIAGNOSTICS v_marked = ROW_COUNT;
    RETURN jsonb_build_object('marked', v_marked);
END;
$$;

COMMENT ON FUNCTION mailroom.http_mark_all_read(text, text, bytea, boolean) IS
'Operation mark_all_read (POST /api/v1/mailboxes/{address}/messages/read, MCP mark_all_read): mark every message of an open inbox read (or, p_is_read false, unread); {"marked": n}, the messages changed. Errors: MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_mark_all_read(text, text, bytea, boolean) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_extend_mailbox(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_ttl_seconds integer
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes := mailroom_internal._http_box(p_address, p_session_token, p_key_digest);
    v_now timestamptz := mailroom.clock();
    v_target timestamptz;
BEGIN
    IF p_ttl_seconds IS NULL OR p_ttl_seconds <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR202',
            MESSAGE = format('ttl_seconds must be a positive number of seconds, got %s', coalesce(p_ttl_seconds::text, 'NULL'));
    END IF;
    -- expires_at = now + ttl, clamped to now + the plan's max TTL, never earlier than it is (an
    -- extension never shortens); under the row lock, re-checked open (as extend_mailbox). The
    -- target is computed first: the UPDATE has only immutable operators over columns (Citus refuses
    -- timestamptz + interval, which is stable, there)
    v_target := v_now + least(
        make_interval(secs => p_ttl_seconds),
        (SELECT make_interval(mins => p.max_ttl_minutes) FROM mailroom.plans AS p WHERE p.name = v_box.plan)
    );
    UPDATE mailroom.mailboxes AS m
    SET expires_at = greatest(m.expires_at, v_target)
    WHERE
        m.id = v_box.id
        AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, v_now)
    RETURNING m.* INTO v_box;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MR205', MESSAGE = format('mailbox expired at %s', v_box.expires_at);
    END IF;
    RETURN mailroom_internal._http_mailbox_json(v_box);
END;
$$;

COMMENT ON FUNCTION mailroom.http_extend_mailbox(text, text, bytea, integer) IS
'POST /api/v1/mailboxes/{address}/extend: expires_at = now + p_ttl_seconds, clamped to the plan''s max TTL (max_ttl_seconds), never earlier than it was; the Mailbox after. Errors: MR202, MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_extend_mailbox(text, text, bytea, integer) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_list_all_messages(
    p_session_token text,
    p_key_digest bytea,
    p_limit integer DEFAULT 50,
    p_before_id bigint DEFAULT null,
    p_tag text DEFAULT null,
    p_unread boolean DEFAULT null,
    p_query text DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owner text;
    v_now timestamptz := mailroom.clock();
    v_boxes bigint[];
    v_ids bigint[];
BEGIN
    -- an owner's list: an API key's only (a session token opens one inbox: MR263, 403)
    IF p_key_digest IS NULL THEN
        IF p_session_token IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR263',
                MESSAGE = 'the list of all mail needs an API key: a session token opens one inbox';
        END IF;
        PERFORM mailroom_internal._http_owner(NULL, NULL);
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'limit must be between 1 and 200';
    END IF;
    IF p_query IS NOT NULL AND (p_tag IS NOT NULL OR p_unread IS NOT NULL) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'q takes no tag or unread beside it: write tag:x or is:unread in the query';
    END IF;
    v_owner := mailroom_internal._api_key_owner(p_key_digest);
    -- the owner's open inboxes (owner types api and mcp, as http_list_mailboxes), then their
    -- messages newest first by id, a page before p_before_id (keyset: ids only grow)
    v_boxes := ARRAY(
        SELECT m.id FROM mailroom.mailboxes AS m
        WHERE
            m.owner_type IN ('api', 'mcp')
            AND m.owner_id = v_owner
            AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, v_now)
    );
    IF p_query IS NOT NULL THEN
        -- the search box of /mail: the matches across those inboxes, newest first by id too (a list,
        -- searched; the same keyset)
        PERFORM mailroom_internal._search_terms(p_query);  -- its refusals, with no inbox open too
        -- one search an inbox (each a query on one inbox: on Citus one shard; the search's correlated
        -- terms are not a multi-shard query), the newest p_limit of all their matches
        v_ids := ARRAY(
            SELECT s.message_id
            FROM unnest(v_boxes) AS x (box_id)
            CROSS JOIN LATERAL mailroom_internal._search_mailboxes(
                ARRAY[x.box_id], p_query, p_limit, p_before_id, true
            ) AS s
            ORDER BY s.message_id DESC
            LIMIT p_limit
        );
        RETURN (
            SELECT coalesce(jsonb_agg(
                mailroom_internal._http_message_summary(g) || jsonb_build_object('mailbox', b.address)
                ORDER BY g.id DESC
            ), '[]')
            FROM (
                SELECT g.* FROM mailroom.messages AS g WHERE g.mailbox_id = ANY(v_boxes) AND g.id = ANY(v_ids)
            ) AS g
            INNER JOIN mailroom.mailboxes AS b ON b.id = g.mailbox_id
        );
    END IF;
    RETURN (
        SELECT coalesce(jsonb_agg(
            mailroom_internal._http_message_summary(g) || jsonb_build_object('mailbox', b.address) ORDER BY g.id DESC
        ), '[]')
        FROM (
            SELECT g.*
            FROM mailroom.messages AS g
            WHERE
                g.mailbox_id = ANY(v_boxes)
                AND (p_before_id IS NULL OR g.id < p_before_id)
                AND (p_tag IS NULL OR lower(btrim(p_tag)) = ANY(g.tags))
                AND (p_unread IS NULL OR g.is_read <> p_unread)
            ORDER BY g.id DESC
            LIMIT p_limit
        ) AS g
        INNER JOIN mailroom.mailboxes AS b ON b.id = g.mailbox_id
    );
END;
$$;

COMMENT ON FUNCTION mailroom.http_list_all_messages(text, bytea, integer, bigint, text, boolean, text) IS
'GET /api/v1/messages: an API key owner''s mail across their open inboxes, newest first by id (keyset: before p_before_id; ?tag=, ?unread=, or ?q= a search query), at most 200, each MessageSummary with its mailbox''s address. Errors: MR263 a session token (403), MR240/MR241, 22023 limit or q beside tag/unread, MR246/MR225-MR227 the query.';

GRANT EXECUTE ON FUNCTION mailroom.http_list_all_messages(text, bytea, integer, bigint, text, boolean, text) TO mailroom_http;
CREATE OR REPLACE FUNCTION mailroom.http_set_inbox_fault(
    p_address text,
    p_session_token text,
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
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
BEGIN
    RETURN mailroom.set_inbox_fault(
        p_address, p_session_token, p_stage, p_reply, coalesce(p_share, 100), p_count, v_who.owner_type, v_who.owner_id
    );
END;
$$;

COMMENT ON FUNCTION mailroom.http_set_inbox_fault(text, text, bytea, text, text, numeric, integer) IS
'PUT /api/v1/mailboxes/{address}/fault: set_inbox_fault (stage, reply, share 100 by default, the next p_count only); the fault as JSON. Errors: MR230, MR231, MR232, MR295, MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_set_inbox_fault(text, text, bytea, text, text, numeric, integer)
TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_clear_inbox_fault(p_address text, p_session_token text, p_key_digest bytea)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
BEGIN
    RETURN mailroom.clear_inbox_fault(p_address, p_session_token, v_who.owner_type, v_who.owner_id);
END;
$$;

COMMENT ON FUNCTION mailroom.http_clear_inbox_fault(text, text, bytea) IS
'DELETE /api/v1/mailboxes/{address}/fault: clear_inbox_fault (the inbox''s own fault; its catch-all domain''s stays); false if it had none. Errors: MR203, MR204, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_clear_inbox_fault(text, text, bytea) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_inbox_fault(p_address text, p_session_token text, p_key_digest bytea)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes := mailroom_internal._http_box(p_address, p_session_token, p_key_digest);
    v_fault jsonb := mailroom_internal._fault_json(v_box.id, v_box.address, split_part(v_box.address, '@', 2));
BEGIN
    IF v_fault IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR270', MESSAGE = 'no fault is set for this inbox or its catch-all domain';
    END IF;
    RETURN v_fault;
END;
$$;

COMMENT ON FUNCTION mailroom.http_inbox_fault(text, text, bytea) IS
'GET /api/v1/mailboxes/{address}/fault: the fault in force for an open inbox (its own, else its catch-all domain''s) as JSON; MR270 when none. Errors: MR270, MR203, MR204, MR205, MR206, MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_inbox_fault(text, text, bytea) TO mailroom_http;

-- Release (issue 35, item 4; sql/32_outbound_release.sql has the rule): the one function through
-- which mailroom_http puts mail in the outbound queue

CREATE OR REPLACE FUNCTION mailroom.http_release_message(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_message_id bigint,
    p_to text,
    p_sender text DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
BEGIN
    -- the key's id: release.rate_per_key counts per API key (sql/32_outbound_release.sql)
    RETURN mailroom_internal._release_message(
        p_address, p_session_token, p_message_id, p_to, p_sender, v_who.owner_type, v_who.owner_id,
        (SELECT k.id FROM mailroom.api_keys AS k WHERE k.digest = p_key_digest AND v_who.owner_id IS NOT NULL)
    );
END;
$$;

COMMENT ON FUNCTION mailroom.http_release_message(text, text, bytea, bigint, text, text) IS
'POST …/messages/{id}/release: release_message for the request''s credential, its rate counted per API key; {"outbound_id", "to", "sender"}. Errors: MR395-MR397 (403), MR301, MR303, MR306, MR318, MR390, MR020 (429), MR021 (403), MR203-MR209.';

GRANT EXECUTE ON FUNCTION mailroom.http_release_message(text, text, bytea, bigint, text, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.face_error_meanings(p_face text)
RETURNS TABLE (code text, meaning text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- every code with its meaning, in a face's own words where mailroom.error_codes speaks of what the
    -- face has not (MCP knows only API keys, no session token): what its tool descriptions list
    SELECT e.code, coalesce(w.words, e.meaning)
    FROM mailroom.error_codes AS e
    LEFT JOIN (VALUES
        ('mcp', 'MR204', 'the inbox is not this API key''s owner''s'),
        ('mcp', 'MR240', 'credentials required: an API key'),
        ('mcp', 'MR295', 'a sink inbox takes no injected fault: fault injection needs an inbox of an API key')
    ) AS w (face, code, words) ON e.code = w.code AND w.face = p_face
    ORDER BY e.code
$$;

COMMENT ON FUNCTION mailroom.face_error_meanings(text) IS
'Every MR code with its meaning as a face (p_face: rest, mcp) says it: mailroom.error_codes, with the face''s own words where the table speaks of a credential the face has not. The MCP server reads it once for its tool descriptions.';

GRANT EXECUTE ON FUNCTION mailroom.face_error_meanings(text) TO mailroom_http;
