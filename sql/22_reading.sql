-- Reading a mailbox: authorized by session token or owner, only while it is open.
-- An expired mailbox raises MR205 (never an empty list that looks normal).

CREATE OR REPLACE FUNCTION mailroom.list_messages(
    p_address text,
    p_session_token text,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null,
    p_limit integer DEFAULT 100,
    p_offset integer DEFAULT 0
)
RETURNS TABLE (
    message_id bigint,
    envelope_from text,
    envelope_to text,
    from_header text,
    subject text,
    text_body text,
    html_body text,
    attachments jsonb,
    size_bytes integer,
    received_at timestamptz,
    is_read boolean
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes;
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 OR p_offset IS NULL OR p_offset < 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'p_limit must be positive and p_offset non-negative';
    END IF;
    v_box := mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id);
    RETURN QUERY
    SELECT
        g.id, g.envelope_from, g.envelope_to, g.from_header, g.subject, g.text_body,
        g.html_body, g.attachments, g.size_bytes, g.received_at, g.is_read
    FROM mailroom.messages AS g
    WHERE g.mailbox_id = v_box.id
    ORDER BY g.received_at, g.id
    LIMIT p_limit OFFSET p_offset;
END;
$$;

COMMENT ON FUNCTION mailroom.list_messages(text, text, text, text, integer, integer) IS
'Messages of an open mailbox, oldest first, for its session token or owner (MR203/MR204/MR205/MR206).';

GRANT EXECUTE ON FUNCTION mailroom.list_messages(text, text, text, text, integer, integer) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom_internal._read_message_row(
    p_address text,
    p_session_token text,
    p_message_id bigint,
    p_owner_type text,
    p_owner_id text
)
RETURNS mailroom.messages
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes := mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id);
    v_message mailroom.messages;
BEGIN
    UPDATE mailroom.messages AS g
    SET is_read = true
    WHERE g.id = p_message_id AND g.mailbox_id = v_box.id
    RETURNING g.* INTO v_message;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR209',
            MESSAGE = format('message %s not found in this mailbox', coalesce(p_message_id::text, 'NULL'));
    END IF;
    RETURN v_message;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._read_message_row(text, text, bigint, text, text) IS
'Internal: read_message''s one step: the stored row of a message of an open mailbox the caller may read, marked read (MR203-MR206 as _authorize_mailbox, MR209 if not in it).';

CREATE OR REPLACE FUNCTION mailroom.read_message(
    p_address text,
    p_session_token text,
    p_message_id bigint,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS TABLE (
    message_id bigint,
    envelope_from text,
    envelope_to text,
    from_header text,
    subject text,
    text_body text,
    html_body text,
    attachments jsonb,
    size_bytes integer,
    received_at timestamptz,
    is_read boolean,
    raw bytea
)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row mailroom.messages := mailroom_internal._read_message_row(
        p_address, p_session_token, p_message_id, p_owner_type, p_owner_id
    );
BEGIN
    RETURN QUERY SELECT
        v_row.id, v_row.envelope_from, v_row.envelope_to, v_row.from_header, v_row.subject, v_row.text_body,
        v_row.html_body, v_row.attachments, v_row.size_bytes, v_row.received_at, v_row.is_read, v_row.raw;
END;
$$;

COMMENT ON FUNCTION mailroom.read_message(text, text, bigint, text, text) IS
'One message of an open mailbox with its raw bytes, marked read; MR209 if it is not in this mailbox.';

GRANT EXECUTE ON FUNCTION mailroom.read_message(text, text, bigint, text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom_internal._inline_images(p_html text, p_attachments jsonb)
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- one pass over the HTML for its cid: references (a bounded character class: linear), joined
    -- with the parts' metadata delivery recorded; the first part of a Content-ID answers for it
    WITH refs AS (
        SELECT r.m[1] AS cid, min(r.n) AS first_at
        FROM regexp_matches(coalesce(p_html, ''), 'cid:([^\s"''<>()]+)', 'gi') WITH ORDINALITY AS r (m, n)
        GROUP BY r.m[1]
    ),
    parts AS (
        SELECT DISTINCT ON (a.value ->> 'content_id')
            a.value ->> 'content_id' AS cid,
            a.value ->> 'content_type' AS content_type,
            a.value ->> 'sha256' AS sha256,
            CASE WHEN jsonb_typeof(a.value -> 'size') = 'number' THEN (a.value ->> 'size')::numeric END AS size
        FROM jsonb_array_elements(
            CASE WHEN jsonb_typeof(p_attachments) = 'array' THEN p_attachments ELSE '[]'::jsonb END
        ) WITH ORDINALITY AS a (value, n)
        WHERE jsonb_typeof(a.value) = 'object' AND a.value ->> 'content_id' IS NOT NULL
        ORDER BY a.value ->> 'content_id', a.n
    ),
    chosen AS (
        SELECT
            refs.cid, refs.first_at, p.content_type, p.sha256, p.size,
            sum(p.size) OVER (ORDER BY refs.first_at) AS running
        FROM refs
        INNER JOIN parts AS p ON p.cid = refs.cid
        -- an image, never SVG (as the attachments' thumbnails), at most 2 MiB, named by its sha256
        WHERE
            p.content_type ~ '^image/[a-z0-9][a-z0-9.+-]*$'
            AND p.content_type <> 'image/svg+xml'
            AND p.size BETWEEN 0 AND 2097152
            AND p.sha256 ~ '^[0-9a-f]{64}$'
    )
    SELECT coalesce(jsonb_agg(
        jsonb_build_object('cid', c.cid, 'content_type', c.content_type, 'sha256', c.sha256, 'size', c.size)
        ORDER BY c.first_at
    ), '[]'::jsonb)
    FROM chosen AS c
    -- in order of first reference, while the total stays within 8 MiB
    WHERE c.running <= 8388608
$$;

COMMENT ON FUNCTION mailroom_internal._inline_images(text, jsonb) IS
'Internal: the inline images of an HTML part, [{cid, content_type, sha256, size}] in order of first reference: each cid: reference whose part (by Content-ID, the first of that ID) is an image/* other than SVG of at most 2 MiB, while their total stays within 8 MiB; any other reference is left out (left as is in the HTML).';
