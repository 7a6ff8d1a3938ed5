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
